"""Translate batches for a migration: in this process, or through a running LEAD server.

Both give the same bytes for the same rows (the server's answers are batch-invariant, and
so is :class:`LocalTranslator`), so a migration may switch between them on resume.
"""

from __future__ import annotations

import gc
import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from lead.artifacts import CONFIG_FILE, WEIGHTS_FILE, load_stitch, stitch_folder
from lead.batch_invariance import forward_batch_invariant
from lead.confidence import missing_head_message
from lead.errors import (
    AuthenticationError,
    InvalidInputError,
    NoConfidenceError,
    NonFiniteOutputError,
    StitchNotFoundError,
)
from lead.stitches import Stitch, oriented
from lead.unit_input import expects_unit_input, normalize_input

__all__ = [
    "LocalTranslator",
    "RemoteTranslator",
    "StitchRef",
    "Translator",
]


@dataclass(frozen=True)
class StitchRef:
    """The stitch a migration uses, as recorded in its target.

    Attributes
    ----------
    name : str
        As the user named it (folder, Hub repo, bundled or server id).
    sha256 : str
        SHA-256 of ``model.safetensors``.
    source_model, target_model : str
        In the direction the migration runs.
    d_in, d_out : int
    unit_input : bool
        The stitch scales its input to unit length (fitted on unit-length vectors), so it
        cannot translate an all-zero vector: :meth:`Source.check` refuses those up front.
    """

    name: str
    sha256: str
    source_model: str
    target_model: str
    d_in: int
    d_out: int
    unit_input: bool = False


class Translator(Protocol):
    """Maps source rows (m, d_in) float32 to target rows (m, d_out) float32."""

    ref: StitchRef
    #: how many batches may be in flight at once (a server pipelines; torch uses its threads)
    concurrency: int

    def __call__(self, rows: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


def stitch_sha256(folder: Path) -> str:
    """SHA-256 over a stitch's ``config.json`` and ``model.safetensors`` (each file's length,
    then its bytes): any change to the weights or to the config (``normalize_output``, the
    architecture) changes it, and the same files give the same digest wherever they are
    (a bundled id, a folder, downloaded from a server)."""
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        path = folder / name
        digest.update(f"{name}:{path.stat().st_size}:".encode())
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _ref(name: str, folder: Path, stitch: Stitch, inverse: bool) -> StitchRef:
    models = (stitch.info.source_model, stitch.info.target_model)
    dims = (stitch.d_src, stitch.d_tgt)
    if inverse:
        models, dims = models[::-1], dims[::-1]
    unit_input = expects_unit_input(stitch, inverse=inverse)
    return StitchRef(name, stitch_sha256(folder), *models, *dims, unit_input)


class LocalTranslator:
    """Run a stitch in this process, batch-invariantly (the bytes the service answers).

    Parameters
    ----------
    name : str or Path
        A stitch folder, a bundled stitch id (``minilm-to-mpnet``) or a Hub repo id.
    inverse : bool, default False
        Run an invertible stitch backwards.
    normalize : bool, default False
        L2-normalise the output rows.
    device : str, optional
        ``cpu`` (default) or ``cuda``.

    Raises
    ------
    StitchNotFoundError, StitchFormatError, NotInvertibleError
    """

    concurrency = 1

    def __init__(
        self,
        name: str | Path,
        *,
        inverse: bool = False,
        normalize: bool = False,
        device: str | None = None,
    ) -> None:
        folder = stitch_folder(name)
        self.stitch = load_stitch(folder, device=device).freeze()
        self._run, _, _ = oriented(self.stitch, inverse=inverse, name=str(name))
        self.inverse, self.normalize = inverse, normalize
        self.ref = _ref(str(name), folder, self.stitch, inverse)
        #: calibrate's record (``decision`` go / no-go, the gates), empty for other stitches
        self.calibration: dict[str, Any] = dict(self.stitch.info.fit.get("calibration") or {})
        self._param = next(self.stitch.parameters())

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        """Translate (m, d_in) float32 rows into (m, d_out) float32 (see :meth:`translate`)."""
        return self.translate(rows)[0]

    def translate(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """Translate (m, d_in) rows; also say how many were rescaled to unit length.

        Returns
        -------
        out : ndarray of shape (m, d_out), float32
        rescaled : int
            Input rows scaled to unit length first (a stitch fitted on unit-length vectors).

        Raises
        ------
        ZeroVectorError
            A zero row for a stitch fitted on unit-length vectors (``row`` is its index).
        NonFiniteOutputError
            The stitch produced NaN or infinity.
        """
        out, rescaled, _ = self._translate(rows, scored=False)
        return out, rescaled

    @property
    def has_confidence(self) -> bool:
        """Whether the stitch has a confidence head (forward direction only)."""
        return self.stitch.confidence_head is not None and not self.inverse

    def require_confidence(self) -> None:
        """Raise :class:`~lead.errors.NoConfidenceError` unless :attr:`has_confidence`."""
        if not self.has_confidence:
            raise _no_confidence(self.ref.name, self.inverse, self.stitch)

    def translate_scored(self, rows: np.ndarray) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
        """:meth:`translate` plus each row's confidence and out-of-distribution flag.

        The translations are the same bytes as :meth:`translate` gives; the scores come
        from the stitch's :class:`~lead.confidence.ConfidenceHead` (batch-invariant too).

        Returns
        -------
        out : ndarray of shape (m, d_out), float32
        rescaled : int
        confidence : ndarray of shape (m,), float32 in [0, 1]
        out_of_distribution : ndarray of shape (m,), bool

        Raises
        ------
        InvalidInputError
            The stitch has no confidence head, or runs backwards (``inverse``).
        ZeroVectorError, NonFiniteOutputError
            As :meth:`translate`.
        """
        self.require_confidence()
        out, rescaled, scores = self._translate(rows, scored=True)
        assert scores is not None
        return out, rescaled, scores[0], scores[1]

    def _translate(
        self, rows: np.ndarray, *, scored: bool
    ) -> tuple[np.ndarray, int, tuple[np.ndarray, np.ndarray] | None]:
        scores = None
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))
            x = x.to(device=self._param.device)
            x, rescaled = normalize_input(self.stitch, x, inverse=self.inverse)
            x = x.to(dtype=self._param.dtype)
            if scored:
                out, confidence, ood = self.stitch.forward_scored(x)
                scores = (confidence.cpu().numpy(), ood.cpu().numpy())
            else:
                out = forward_batch_invariant(self._run, x)
            if self.normalize:
                out = torch.nn.functional.normalize(out, dim=1)
            if not bool(torch.isfinite(out).all()):
                raise NonFiniteOutputError("the stitch produced NaN or infinity")
            return out.float().cpu().numpy(), rescaled, scores

    def close(self) -> None:
        pass


def _no_confidence(name: str, inverse: bool, stitch: Stitch | None = None) -> NoConfidenceError:
    if inverse:
        return NoConfidenceError(
            "confidence is only available translating forward, not with --inverse",
            param="confidence",
        )
    return NoConfidenceError(missing_head_message(stitch, name), param="confidence")


class RemoteTranslator:
    """Translate through a running LEAD server (``POST /v1/translate`` with Arrow bodies).

    Rows go in requests of at most the server's ``max_vectors_arrow``; a 429 / 503 is
    retried after ``Retry-After`` (:meth:`lead.client.LeadClient.translate`). The stitch's
    files are downloaded once (``GET /v1/stitch-files``) to record its SHA-256 and models.

    Parameters
    ----------
    server : str
        The server URL.
    stitch : str
        A stitch id the server serves.
    inverse : bool, default False
        Not supported through a server yet: raises.
    normalize : bool, default False
    api_key : str, optional
        Default ``LEAD_API_KEY``.
    concurrency : int, default 4
        Requests in flight at once.

    Raises
    ------
    StitchNotFoundError
        The server does not serve ``stitch``.
    """

    def __init__(
        self,
        server: str,
        stitch: str,
        *,
        inverse: bool = False,
        normalize: bool = False,
        api_key: str | None = None,
        concurrency: int = 4,
    ) -> None:
        from lead.client import LeadClient

        if inverse:
            raise StitchNotFoundError(
                "--inverse is not available with --server; run it in-process", param="inverse"
            )
        if not server.startswith(("http://", "https://")):
            raise InvalidInputError(
                f"--server must be an http:// or https:// URL, got {server!r}", param="server"
            )
        self.server = server
        self.client = LeadClient(server, api_key=api_key, timeout=600.0)
        self.stitch_id, self.normalize, self.concurrency = stitch, normalize, concurrency
        tmp = Path(tempfile.mkdtemp(prefix="lead-stitch-"))
        try:
            with _reaching(server):
                folder = self.client.download_stitch(stitch, tmp / "stitch")
            local = load_stitch(folder)
            self.ref = _ref(stitch, folder, local, False)
            self.has_confidence = local.confidence_head is not None
            self.calibration = dict(local.info.fit.get("calibration") or {})
        except BaseException:
            self.client.close()
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        with _reaching(self.server):
            out: np.ndarray = self.client.translate(
                rows, stitch=self.stitch_id, normalize=self.normalize, format="arrow"
            )
        # httpx keeps each response (its whole body, ~36 MB at 8,192 x 768) in a reference
        # cycle that only the cyclic collector frees, and it runs rarely: collect the young
        # generations now so that memory stays flat whatever the table's size
        gc.collect(1)
        return out

    def require_confidence(self) -> None:
        """Raise :class:`~lead.errors.NoConfidenceError` unless the served stitch has a
        confidence head (read from its downloaded files)."""
        if not self.has_confidence:
            raise _no_confidence(self.ref.name, False)

    def translate_scored(self, rows: np.ndarray) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
        """:meth:`__call__` with ``return_confidence=true``: the same vectors, and each row's
        confidence and out-of-distribution flag as the server computes them (the bytes the
        in-process :meth:`LocalTranslator.translate_scored` gives). The rescaled count is
        not reported through a server (0)."""
        with _reaching(self.server):
            out, confidence, ood = self.client.translate_with_confidence(
                rows, stitch=self.stitch_id, normalize=self.normalize, format="arrow"
            )
        gc.collect(1)
        return out, 0, confidence, ood

    def close(self) -> None:
        self.client.close()


@contextmanager
def _reaching(server: str) -> Iterator[None]:
    """A refused key says where a migration's key comes from (an unreachable server is
    already a :class:`~lead.errors.StoreError` naming its URL: :class:`~lead.client.LeadClient`)."""
    try:
        yield
    except AuthenticationError as error:
        raise AuthenticationError(
            f"{error.message} (the LEAD server at {server} wants an API key: migrations send "
            "the one of --api-key, else LEAD_API_KEY)",
            param=error.param,
        ) from None


def make_translator(
    stitch: str | Path,
    *,
    server: str | None = None,
    inverse: bool = False,
    normalize: bool = False,
    device: str | None = None,
    api_key: str | None = None,
) -> Translator:
    """A :class:`RemoteTranslator` when ``server`` is given, else a :class:`LocalTranslator`."""
    if server:
        return RemoteTranslator(
            server, str(stitch), inverse=inverse, normalize=normalize, api_key=api_key
        )
    return LocalTranslator(stitch, inverse=inverse, normalize=normalize, device=device)


def describe(translator: Translator) -> dict[str, Any]:
    ref = translator.ref
    return {
        "stitch": ref.name,
        "stitch_sha256": ref.sha256,
        "source_model": ref.source_model,
        "target_model": ref.target_model,
        "source_dim": ref.d_in,
        "target_dim": ref.d_out,
    }

"""Save, load and publish stitch artifacts: ``config.json`` + ``model.safetensors`` + ``README.md``.

A stitch is a folder (or a Hugging Face Hub model repo holding the same three files).
Saving is atomic; loading validates the config, then the tensor names and shapes against a
freshly built stitch, and reads tensors with safetensors only (never pickle).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from lead._confidence_head import check_head, head_from_config
from lead._durable import fsync_path
from lead._hub import download_snapshot, upload_folder
from lead._model_card import model_card
from lead._validation import check_device, check_stitch
from lead._version import __version__
from lead.errors import (
    ConflictError,
    HubError,
    InvalidInputError,
    LeadError,
    ShapeMismatchError,
    StitchFormatError,
    StitchNotFoundError,
    StorageFullError,
)
from lead.stitches import Stitch, StitchInfo, stitch_class

__all__ = [
    "ARTIFACT_FILES",
    "BUNDLED_MODELS_DIR",
    "FORMAT",
    "FORMAT_VERSION",
    "check_replaceable",
    "check_storable",
    "is_occupied",
    "is_replaceable",
    "load_stitch",
    "push_stitch",
    "read_stitch_config",
    "replace_folder",
    "save_stitch",
    "stitch_folder",
]

FORMAT = "lead-stitch"
FORMAT_VERSION = 1
WEIGHT_ORIENTATION = "(d_tgt, d_src)"
CONFIG_FILE, WEIGHTS_FILE, CARD_FILE = "config.json", "model.safetensors", "README.md"
ARTIFACT_FILES = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)
#: Tensors of the stitch's confidence head are named ``confidence.*`` (always float32).
CONFIDENCE_PREFIX = "confidence."
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
#: The bundled stitches of a source checkout (``models/``), each a folder named by its id.
BUNDLED_MODELS_DIR = Path(__file__).resolve().parents[1] / "models"


#: The largest config.json read (the bundled ones, held-out ids included, are ~100 KB).
MAX_CONFIG_BYTES = 16 << 20


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray | torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to config.json")


#: Dtypes a stitch may be stored in; loading always gives float32 unless asked otherwise.
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _stitch_config(stitch: Stitch, tensors: dict[str, torch.Tensor], dtype: str) -> dict[str, Any]:
    info = stitch.info
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "architecture": stitch.architecture,
        "weight_orientation": WEIGHT_ORIENTATION,
        "source": {
            "model": info.source_model,
            "dim": stitch.d_src,
            "revision": info.source_revision,
            "normalized": info.source_normalized,
        },
        "target": {
            "model": info.target_model,
            "dim": stitch.d_tgt,
            "revision": info.target_revision,
            "normalized": info.target_normalized,
        },
        **stitch.get_config(),
        "normalize_output": stitch.normalize_output,
        "fit": info.fit,
        "scorecard": info.scorecard,
        **(
            {"confidence": stitch.confidence_head.get_config()}
            if stitch.confidence_head is not None
            else {}
        ),
        "lead_version": __version__,
        "dtype": dtype,
        "tensors": {name: list(t.shape) for name, t in tensors.items()},
    }


def _storage_dtype(name: str, dtype: str) -> torch.dtype:
    """The confidence head's tensors stay float32 (its knots must increase strictly)."""
    return torch.float32 if name.startswith(CONFIDENCE_PREFIX) else STORAGE_DTYPES[dtype]


def is_occupied(folder: Path) -> bool:
    """Whether ``folder`` exists and is anything but an empty folder."""
    if not folder.exists() and not folder.is_symlink():
        return False
    return not folder.is_dir() or folder.is_symlink() or any(folder.iterdir())


def _exists(folder: Path) -> ConflictError:
    if folder.exists() and not folder.is_dir():
        return ConflictError(f"{folder} is a file, not a folder: choose a folder", param="folder")
    return ConflictError(
        f"{folder} exists already and is not empty; choose another folder, or allow "
        "replacing it (overwrite=True; lead fit --force)",
        param="folder",
    )


def is_replaceable(folder: Path) -> bool:
    """Whether ``folder`` is a folder that may be replaced by a stitch: empty, or holding
    only a stitch's files (a user's files beside them are not ours to delete)."""
    if not folder.is_dir() or folder.is_symlink():
        return False
    names = {entry.name for entry in folder.iterdir()}
    if not names:
        return True
    if not names <= set(ARTIFACT_FILES):  # a user's files beside it: not ours to delete
        return False
    try:
        return bool(json.loads((folder / CONFIG_FILE).read_text()).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def check_replaceable(folder: Path) -> None:
    """Refuse to replace ``folder`` unless it is absent or a stitch folder.

    Raises
    ------
    InvalidInputError
        If ``folder`` exists and is not a stitch folder holding only the artifact files
        (replacing it would delete everything in it).
    """
    if folder.exists() and not is_replaceable(folder):
        raise InvalidInputError(
            f"refusing to replace {folder}: it is not a stitch folder holding only "
            f"{', '.join(ARTIFACT_FILES)} (replacing it deletes everything in it)",
            param="folder",
        )


def save_stitch(
    stitch: Stitch, folder: str | Path, *, dtype: str = "float32", overwrite: bool = True
) -> Path:
    """Write a stitch to ``folder`` atomically.

    Parameters
    ----------
    stitch : Stitch
        Any registered stitch.
    folder : str or Path
        Destination. Its parent is created. An existing ``folder`` is replaced only if it
        is empty or holds a stitch (and, for a stitch, ``overwrite`` is true).
    dtype : {"float32", "float16", "bfloat16"}, default "float32"
        Storage dtype of the tensors (recorded as ``dtype`` in ``config.json``). float16
        halves the file; :func:`load_stitch` returns float32 parameters equal to the stored
        values, so round the stitch first (``stitch.half().float()``) to score exactly what
        is stored.

    overwrite : bool, default True
        Replace a stitch already in ``folder``; when false, a ``folder`` that exists and is
        not empty (checked again at the final rename) is an error.

    Returns
    -------
    Path
        ``folder``, holding ``config.json``, ``model.safetensors`` and ``README.md``.

    Raises
    ------
    InvalidInputError
        If ``stitch`` is not a stitch, ``folder`` exists and is not an empty folder or a
        stitch folder, or cannot be created (a read-only place, no permission), ``dtype``
        is not a storage dtype, or a tensor does not fit ``dtype`` (beyond its range, or
        changed by more than :data:`MAX_STORAGE_ERROR` of its norm).
    ShapeMismatchError
        If the stitch's confidence head weighs stitch features that this architecture
        does not give (a head fitted for another stitch).
    ConflictError
        If ``overwrite`` is false and ``folder`` exists and is not empty.

    Notes
    -----
    The files are written and fsynced in a temporary folder beside ``folder``, which is
    then renamed into place (an old version is moved aside first and deleted last), so a
    reader never sees a half-written stitch.
    """
    check_stitch(stitch)
    folder = Path(folder)
    if not overwrite and is_occupied(folder):
        raise _exists(folder)
    check_replaceable(folder)
    if dtype not in STORAGE_DTYPES:
        raise InvalidInputError(
            f"dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}", param="dtype"
        )
    head = stitch.confidence_head
    problem = None if head is None else _head_features_problem(stitch, head.stitch_features)
    if problem is not None:  # it would not load back
        raise ShapeMismatchError(
            f"the confidence head's {problem}", param="confidence_head", expected=0, got=problem
        )
    tensors = {
        name: t.detach().to(device="cpu", dtype=_storage_dtype(name, dtype)).contiguous().clone()
        for name, t in stitch.state_dict().items()
    }
    _check_stored(stitch.state_dict(), tensors, dtype)
    config = _stitch_config(stitch, tensors, dtype)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    except OSError as error:  # a read-only place, a file in the path, no permission
        if isinstance(error, FileExistsError | NotADirectoryError):
            reason = f"a file, not a folder, is on the path {folder.parent}"
        else:
            reason = f"{folder.parent}: {error.strerror or type(error).__name__}"
        raise InvalidInputError(
            f"cannot save the stitch in {folder}: {reason}", param="folder"
        ) from error
    try:
        try:
            save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        except SafetensorError as error:  # safetensors reports the OS error as text
            if "os error 28" in str(error) or "os error 122" in str(error):
                raise StorageFullError(f"no space left to save the stitch in {folder}") from error
            raise
        text = json.dumps(config, indent=2, allow_nan=False, default=_json_default) + "\n"
        (tmp / CONFIG_FILE).write_text(text, encoding="utf-8")
        (tmp / CARD_FILE).write_text(model_card(config, folder.name), encoding="utf-8")
        for name in ARTIFACT_FILES:
            (tmp / name).chmod(0o644)
            fsync_path(tmp / name)
        tmp.chmod(0o755)
        replace_folder(tmp, folder, overwrite=overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def replace_folder(tmp: Path, folder: Path, *, overwrite: bool) -> None:
    """Rename the complete folder ``tmp`` (a sibling of ``folder``) to ``folder``: an old
    ``folder`` is moved aside first (when ``overwrite``) and deleted last, so that a reader
    sees the old files or the new ones, never a mix.

    Raises
    ------
    ConflictError
        If ``overwrite`` is false and ``folder`` was filled meanwhile.
    OSError
        If the rename fails (the old folder is put back).
    """
    old = None
    if overwrite and folder.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
        os.replace(folder, old / folder.name)
    try:
        os.replace(tmp, folder)  # onto an empty folder at most: never a full one
    except OSError:
        if old is not None:
            os.replace(old / folder.name, folder)
        if not overwrite and is_occupied(folder):  # written there meanwhile
            raise _exists(folder) from None
        raise
    fsync_path(folder.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON (write the value as null or a finite number)")


def read_stitch_config(folder: str | Path) -> dict[str, Any]:
    """Read and check a stitch folder's ``config.json``.

    Parameters
    ----------
    folder : str or Path
        A local stitch folder.

    Returns
    -------
    dict
        The parsed config, with ``format``, ``format_version``, ``architecture`` and
        positive integer ``source.dim`` / ``target.dim`` checked.

    Raises
    ------
    StitchNotFoundError
        If ``folder`` is not a directory.
    StitchFormatError
        If ``config.json`` is missing, not strict JSON (``NaN``, ``Infinity``), or fails
        the checks.
    UnknownArchitectureError
        If ``architecture`` is not in :data:`lead.stitches.STITCH_REGISTRY`.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise StitchNotFoundError(f"no stitch folder at {folder}", param="stitch")
    path = folder / CONFIG_FILE
    if path.exists() and not path.is_file():  # a FIFO would block the reader for ever
        raise StitchFormatError(f"{path} is not a regular file", param="stitch")
    if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:  # read whole below
        raise StitchFormatError(
            f"{path} holds {path.stat().st_size} bytes; a stitch config holds at most "
            f"{MAX_CONFIG_BYTES}",
            param="stitch",
        )
    try:
        # strict JSON: Python's json reads NaN and Infinity, which no other reader (nor
        # save_stitch, which writes strict JSON) takes
        text = path.read_text(encoding="utf-8")
        config = json.loads(text, parse_constant=_not_json)
    except FileNotFoundError:
        raise StitchFormatError(f"{folder} has no {CONFIG_FILE}", param="stitch") from None
    except (OSError, ValueError) as error:
        raise StitchFormatError(f"cannot read {folder / CONFIG_FILE}: {error}") from None
    except RecursionError:  # json's parser recurses once per level
        raise StitchFormatError(
            f"cannot read {folder / CONFIG_FILE}: arrays or objects nested too deeply"
        ) from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise StitchFormatError(f"{folder / CONFIG_FILE} is not a {FORMAT!r} config")
    version = config.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:  # true == 1 in Python
        raise StitchFormatError(
            f"unsupported format_version {config.get('format_version')!r} "
            f"(this lead reads version {FORMAT_VERSION})"
        )
    if config.get("weight_orientation") != WEIGHT_ORIENTATION:
        raise StitchFormatError(
            f"weight_orientation must be {WEIGHT_ORIENTATION!r}, "
            f"got {config.get('weight_orientation')!r}"
        )
    stitch_class(str(config.get("architecture")))
    for side in ("source", "target"):
        entry = config.get(side)
        if not isinstance(entry, dict):
            raise StitchFormatError(f"config {side!r} must be an object with model and dim")
        dim = entry.get("dim")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise StitchFormatError(f"config {side}.dim must be a positive integer, got {dim!r}")
        _check_type(entry, "model", str, f"{side}.", "a string")
        _check_type(entry, "revision", str, f"{side}.", "a string or null")
        _check_type(entry, "normalized", bool, f"{side}.", "true or false")
    for key in ("fit", "scorecard", "confidence"):
        _check_type(config, key, dict, "", "an object or null")
    for key in ("normalize_output", "output_scale"):
        _check_type(config, key, bool, "", "true or false")
    dtype = config.get("dtype")
    if dtype is not None and dtype not in STORAGE_DTYPES:  # what the card and the API show
        raise StitchFormatError(
            f"config dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r:.80}"
        )
    return config


def _check_type(entry: dict[str, Any], key: str, kind: type, prefix: str, what: str) -> None:
    """Refuse ``entry[key]`` unless it is absent, null or of ``kind``: a served stitch shows
    these values as they are (a scorecard that is a string broke ``GET /v1/stitches``)."""
    value = entry.get(key)
    if value is not None and not isinstance(value, kind):
        raise StitchFormatError(f"config {prefix}{key} must be {what}, got {value!r:.80}")


def _build(config: dict[str, Any]) -> Stitch:
    cls = stitch_class(config["architecture"])
    missing = [key for key in cls.config_keys if key not in config]
    if missing:
        raise StitchFormatError(f"config lacks architecture parameter(s) {', '.join(missing)}")
    _check_parameter_types(cls, config)
    source, target = config["source"], config["target"]
    info = StitchInfo(
        source_model=source.get("model", StitchInfo.source_model),
        target_model=target.get("model", StitchInfo.target_model),
        source_normalized=bool(source.get("normalized", True)),
        target_normalized=bool(target.get("normalized", True)),
        source_revision=source.get("revision"),
        target_revision=target.get("revision"),
        fit=dict(config.get("fit") or {}),
        scorecard=config.get("scorecard"),
    )
    try:
        stitch = cls(
            source["dim"],
            target["dim"],
            normalize_output=bool(config.get("normalize_output", False)),
            info=info,
            output_scale=bool(config.get("output_scale", False)),
            **{key: config[key] for key in cls.config_keys},
            **{key: config.get(key, default) for key, default in cls.optional_config_keys.items()},
        )
    except (LeadError, TypeError, ValueError) as error:
        raise StitchFormatError(f"cannot build a {cls.architecture} stitch: {error}") from None
    except (RuntimeError, OverflowError) as error:  # dims of 2**31: sizes overflow in torch
        raise StitchFormatError(
            f"cannot build a {cls.architecture} stitch of dimensions {source['dim']} -> "
            f"{target['dim']}: {str(error)[:200]}"
        ) from None
    if config.get("confidence") is not None:
        confidence = head_from_config(config["confidence"], stitch.d_src, stitch.d_tgt)
        problem = _head_features_problem(stitch, confidence.stitch_features)
        if problem is not None:
            raise StitchFormatError(f"config confidence.{problem}")
        stitch.confidence_head = confidence
    return stitch


def _check_parameter_types(cls: type[Stitch], config: dict[str, Any]) -> None:
    """Each architecture parameter of the kind its default has: a boolean for a boolean, a
    number (not a boolean) for a number. ``"scaling": "false"`` loaded as true, and
    ``"max_log_scale": true`` as 1.0 (outputs off by 7.5e-4)."""
    parameters = inspect.signature(cls.__init__).parameters
    for key in (*cls.config_keys, *(k for k in cls.optional_config_keys if k in config)):
        default = parameters[key].default if key in parameters else None
        value = config[key]
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int | float):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            continue
        if not ok:
            kind = "true or false" if isinstance(default, bool) else "a number"
            raise StitchFormatError(f"config {key} must be {kind}, got {value!r:.80}")


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The tensor shapes that ``config`` declares, from a stitch built without memory (on
    torch's ``meta`` device): a config that declares dimensions of 20,000 must not
    allocate gigabytes before its weights file is found to hold 384."""
    with torch.device("meta"):
        stitch = _build(config)
    return {name: tuple(t.shape) for name, t in stitch.state_dict().items()}


#: The largest relative error (Frobenius) a matrix may take from its storage dtype: float16
#: and bfloat16 round by 2**-11 and 2**-8; more means values beyond their range or below
#: their precision. Vectors (means, biases) are checked for overflow only.
MAX_STORAGE_ERROR = 1e-2


def check_storable(stitch: Stitch, dtype: str) -> None:
    """Refuse a stitch whose tensors its storage ``dtype`` cannot hold (as
    :func:`save_stitch` does): values beyond the dtype's range (they would load as
    infinity), or so small that they round away (a ridge of targets at 1e-9 saved as
    float16 answered the mean for every input).

    Parameters
    ----------
    stitch : Stitch
    dtype : {"float32", "float16", "bfloat16"}

    Raises
    ------
    InvalidInputError
        Naming the first such tensor, its largest magnitude and the dtype; or an unknown
        ``dtype``.
    """
    if dtype not in STORAGE_DTYPES:
        raise InvalidInputError(
            f"dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}", param="dtype"
        )
    state = stitch.state_dict()
    stored = {name: t.detach().to("cpu", _storage_dtype(name, dtype)) for name, t in state.items()}
    _check_stored(state, stored, dtype)


def _check_stored(state: dict[str, Tensor], stored: dict[str, Tensor], dtype: str) -> None:
    """:func:`check_storable` of the tensors ``state`` as ``stored`` in ``dtype``."""
    for name, tensor in state.items():
        kept = stored[name]
        if kept.dtype == tensor.dtype or not tensor.is_floating_point() or not tensor.numel():
            continue
        exact = tensor.detach().to("cpu", torch.float64)
        norm = float(exact.norm())
        error = float((kept.to(torch.float64) - exact).norm())
        if math.isfinite(error) and (error <= MAX_STORAGE_ERROR * norm or tensor.ndim < 2):
            # a vector (a mean, a bias, a scale) only overflows: the mean of centred data
            # (~1e-9) rounds to 0 in float16 and changes nothing beside data of unit scale
            continue
        raise _not_storable(name, exact, kept.dtype, dtype, error, norm)


def _not_storable(
    name: str, exact: Tensor, kind: torch.dtype, dtype: str, error: float, norm: float
) -> InvalidInputError:
    """The error for tensor ``name`` (``exact``, float64) that ``dtype`` cannot hold."""
    peak, largest = float(exact.abs().max()), float(torch.finfo(kind).max)
    why = (
        f"its values reach {peak:.3g}, beyond {dtype}'s largest {largest:.3g}"
        if peak > largest or not math.isfinite(error)
        else f"{dtype} would change it by {error / norm:.1%} (its values, at most {peak:.3g} "
        "in magnitude, are below its precision)"
    )
    return InvalidInputError(
        f"tensor {name!r} does not fit {dtype}: {why}; save in float32", param="dtype"
    )


def _head_features_problem(stitch: Stitch, stitch_features: int) -> str | None:
    """Why a head taking ``stitch_features`` features of the stitch cannot ride on it."""
    names = type(stitch).confidence_feature_names
    if stitch_features in (0, len(names)):
        return None
    return (
        f"stitch_features is {stitch_features}, but {stitch.architecture} stitches give "
        f"{len(names)} ({', '.join(names) or 'none'})"
    )


def _check_tensors(expected: dict[str, tuple[int, ...]], got: dict[str, tuple[int, ...]]) -> None:
    for name, shape in expected.items():
        if name not in got:
            raise StitchFormatError(f"tensor {name!r} is missing (expected shape {list(shape)})")
        if tuple(got[name]) != shape:
            raise StitchFormatError(
                f"tensor {name!r} has shape {list(got[name])}, expected {list(shape)}"
            )
    extra = sorted(set(got) - set(expected))
    if extra:
        raise StitchFormatError(f"unexpected tensor {extra[0]!r} (extra: {', '.join(extra)})")


def _load_folder(folder: Path) -> Stitch:
    config = read_stitch_config(folder)
    expected = _expected_shapes(config)
    declared = config.get("tensors")
    if declared is not None:
        if not isinstance(declared, dict) or not all(
            isinstance(v, list) for v in declared.values()
        ):
            raise StitchFormatError("config 'tensors' must map tensor names to shapes (lists)")
        _check_tensors(expected, {k: tuple(v) for k, v in declared.items()})
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():  # a FIFO would block the reader
        raise StitchFormatError(f"{folder} has no {WEIGHTS_FILE} (a regular file)")
    try:
        with safe_open(str(weights), framework="pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
        _check_tensors(expected, shapes)
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as error:
        raise StitchFormatError(f"cannot read {weights}: {error}") from None
    stitch = _build(config)
    for name, t in tensors.items():
        if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
            raise StitchFormatError(f"tensor {name!r} must be finite floating point numbers")
    stitch.load_state_dict({k: t.float() for k, t in tensors.items()}, strict=True)
    try:
        stitch.check_loaded()
    except LeadError as error:
        raise StitchFormatError(f"{folder}: {error}") from None
    if stitch.confidence_head is not None:
        check_head(stitch.confidence_head)
    return stitch


def stitch_folder(folder_or_repo_id: str | Path, revision: str | None = None) -> Path:
    """The local folder holding a stitch's files, downloading a Hub stitch when needed.

    Parameters
    ----------
    folder_or_repo_id : str or Path
        A local stitch folder (returned as it is); a bundled stitch's id
        (``minilm-to-mpnet``: a folder of :data:`BUNDLED_MODELS_DIR`, in a source checkout);
        otherwise a Hub repo id ``org/name``, optionally pinned as ``org/name@revision``,
        whose ``config.json``, ``model.safetensors`` and ``README.md`` are fetched through
        the Hugging Face cache.
    revision : str, optional
        Hub branch, tag or commit; must agree with an ``@revision`` in the id.

    Returns
    -------
    Path
        A folder that :func:`load_stitch` loads (its files are not checked here).

    Raises
    ------
    StitchNotFoundError
        No such folder, no such Hub repo / revision, or not cached while offline.
    InvalidInputError
        If ``revision`` disagrees with the id's ``@revision``.
    HubError
        The Hub could not be reached or refused the download.
    """
    spec = str(folder_or_repo_id)
    folder = Path(spec)
    if folder.is_dir():
        return folder
    bundled = BUNDLED_MODELS_DIR / spec
    if "/" not in spec and spec not in (".", "..") and (bundled / CONFIG_FILE).is_file():
        return bundled
    repo_id, at, pinned = spec.partition("@")
    if at and not pinned.strip():  # "org/name@" downloaded main
        raise InvalidInputError(
            f"{spec!r} names no revision after '@': give org/name or org/name@REVISION",
            param="stitch",
        )
    if not _REPO_ID.match(repo_id) or (folder.exists() and not pinned):
        raise StitchNotFoundError(
            f"no stitch folder, bundled stitch or Hub repo {spec!r}{_bundled_hint()}",
            param="stitch",
        )
    if pinned and revision and pinned != revision:
        raise InvalidInputError(f"revision {revision!r} disagrees with {spec!r}", param="revision")
    try:
        return download_snapshot(repo_id, pinned or revision, ARTIFACT_FILES)
    except (HubError, StitchNotFoundError) as error:
        # "models/minilm-to-mpnett" has a Hub id's form, but models/ is a folder here: a
        # misspelt path, which the Hub's network error would not say
        near = Path(repo_id).parent
        if not near.is_dir() or (near / Path(repo_id).name).exists():  # there: pinned?
            raise
        raise StitchNotFoundError(
            f"no stitch folder {spec!r}: the folder {near} has no {Path(repo_id).name!r} "
            f"(as a Hub repo id it was not found either: {error.message})",
            param="stitch",
        ) from None


def _bundled_hint() -> str:
    """``" (bundled: a, b, ...)"``, or nothing when there are no bundled stitches."""
    if not BUNDLED_MODELS_DIR.is_dir():
        return ""
    ids = sorted(p.name for p in BUNDLED_MODELS_DIR.iterdir() if (p / CONFIG_FILE).is_file())
    return f" (bundled: {', '.join(ids)})" if ids else ""


def load_stitch(
    folder_or_repo_id: str | Path,
    revision: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Stitch:
    """Load a stitch from a local folder or a Hugging Face Hub model repo.

    Parameters
    ----------
    folder_or_repo_id : str or Path
        A local stitch folder, a bundled stitch's id (``minilm-to-mpnet``, in a source
        checkout); otherwise a Hub repo id ``org/name``, optionally pinned as
        ``org/name@revision``. Hub files go through ``huggingface_hub.snapshot_download``,
        which uses the Hugging Face cache (``HF_HUB_CACHE``) and honours ``HF_HUB_OFFLINE``.
    revision : str, optional
        Hub branch, tag or commit; must agree with an ``@revision`` in the id.
    device : str or torch.device, optional
        Device to move the stitch to (default CPU).
    dtype : torch.dtype, optional
        Floating dtype of the parameters (default float32, as stored).

    Returns
    -------
    Stitch
        In eval mode, with gradients off.

    Raises
    ------
    StitchNotFoundError
        No such folder, no such Hub repo / revision, or not cached while offline.
    StitchFormatError
        A bad config, a missing, extra or wrongly shaped tensor, or unreadable files.
    UnknownArchitectureError
        An architecture that is not registered.
    HubError
        The Hub could not be reached or refused the download.
    InvalidInputError
        An unknown device, or a CUDA device this machine does not have; a ``dtype`` that
        is not a floating torch dtype.
    """
    target = check_device("cpu" if device is None else device)  # before any file is read
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InvalidInputError(
            f"dtype must be a floating torch dtype (torch.float16, torch.bfloat16, "
            f"torch.float32, torch.float64), got {dtype!r:.80}",
            param="dtype",
        )
    stitch = _load_folder(stitch_folder(folder_or_repo_id, revision))
    stitch.requires_grad_(False)
    stitch.to(device=target)
    if dtype is not None:
        stitch.to(dtype=dtype)
    return stitch.eval()


def push_stitch(
    folder: str | Path, repo_id: str, *, token: str | None = None, revision: str | None = None
) -> str:
    """Upload a saved stitch folder to a Hugging Face Hub model repo.

    Parameters
    ----------
    folder : str or Path
        A stitch folder written by :func:`save_stitch`; it is loaded once as a check.
    repo_id : str
        ``org/name``; the repo is created if it does not exist.
    token : str, optional
        Hub token (default: the logged-in one, or ``HF_TOKEN``).
    revision : str, optional
        Branch to commit to (created if missing); default ``main``.

    Returns
    -------
    str
        ``"org/name@<commit sha>"``, an id :func:`load_stitch` accepts.

    Raises
    ------
    StitchNotFoundError, StitchFormatError
        If ``folder`` is not a valid stitch.
    HubError
        If the upload fails.
    """
    _load_folder(Path(folder))
    return upload_folder(Path(folder), repo_id, ARTIFACT_FILES, token=token, revision=revision)

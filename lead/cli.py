"""The ``lead`` command line: fit a stitch, score it, translate files with it.

::

    lead fit --source minilm.safetensors:corpus --target mpnet.safetensors:corpus \\
        --method ridge --source-model sentence-transformers/all-MiniLM-L6-v2 \\
        --target-model sentence-transformers/all-mpnet-base-v2 --out models/minilm-to-mpnet
    lead score models/minilm-to-mpnet --source X.npy --target Y.npy --all
    lead translate models/minilm-to-mpnet --input corpus.npy --output translated.npy

``lead translate`` scales input rows to unit length first when the stitch was fitted on
unit-length vectors (a zero row is an error), and reports how many it rescaled.

Results go to stdout as JSON, progress bars to stderr, and a :class:`~lead.errors.LeadError`
becomes ``error: <message>`` on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lead._argparse import CommandParser
from lead._options import FIT_METHODS_HELP, parse_option_items, seed_argument, text_argument
from lead.errors import (
    ConflictError,
    InvalidInputError,
    LeadError,
    NonFiniteOutputError,
    ShapeMismatchError,
    TooFewPairsError,
    ZeroVectorError,
)
from lead.splits import holdout_split

__all__ = ["build_parser", "main"]


#: What a stitch argument takes (``lead.artifacts.stitch_folder``).
STITCH_ARGUMENT_HELP = (
    "a bundled stitch id (minilm-to-mpnet), a stitch folder or a Hub repo id org/name[@revision]"
)


def _load_pairs(
    sources: Sequence[str], targets: Sequence[str]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    from lead.data import read_embeddings

    if len(sources) != len(targets):
        raise InvalidInputError(
            f"give as many --source as --target files (got {len(sources)} and {len(targets)})",
            param="target",
        )
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for source, target in zip(sources, targets, strict=True):
        X, Y = read_embeddings(source), read_embeddings(target)
        if X.shape[0] != Y.shape[0]:
            raise ShapeMismatchError(
                f"{source} has {X.shape[0]} rows but {target} has {Y.shape[0]}",
                expected=X.shape[0],
                got=Y.shape[0],
                param=target,
            )
        if xs and (X.shape[1] != xs[0].shape[1] or Y.shape[1] != ys[0].shape[1]):
            raise ShapeMismatchError(
                f"{source} / {target} have dimensions {X.shape[1]} / {Y.shape[1]}, "
                f"unlike the first pair ({xs[0].shape[1]} / {ys[0].shape[1]})",
                expected=(xs[0].shape[1], ys[0].shape[1]),
                got=(X.shape[1], Y.shape[1]),
                param=source,
            )
        xs.append(X)
        ys.append(Y)
    return xs, ys


def _split_rows(
    sizes: Sequence[int], holdout: float, seed: int, holdout_from: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Training and held-out row indices into the concatenation of all pairs."""
    total = int(sum(sizes))
    if holdout == 0:
        return np.arange(total), np.arange(0)
    if holdout_from is None:
        return holdout_split(total, holdout, seed)
    if not 1 <= holdout_from <= len(sizes):
        raise InvalidInputError(
            f"--holdout-from must be between 1 and {len(sizes)}", param="holdout_from"
        )
    offset = int(sum(sizes[: holdout_from - 1]))
    train, test = holdout_split(sizes[holdout_from - 1], holdout, seed)
    inside = np.arange(offset, offset + sizes[holdout_from - 1])
    others = np.setdiff1d(np.arange(total), inside)
    return np.sort(np.concatenate([others, train + offset])), test + offset


#: ``--general-holdout`` when not given.
DEFAULT_GENERAL_HOLDOUT = 0.1


def _general_share(args: argparse.Namespace) -> float:
    """``--general-holdout``, or :data:`DEFAULT_GENERAL_HOLDOUT` (None marks "not given",
    which ``--general-holdout`` without ``--general-from`` is refused for)."""
    share = args.general_holdout
    return DEFAULT_GENERAL_HOLDOUT if share is None else float(share)


def _general_rows(
    sizes: Sequence[int], train: np.ndarray, test: np.ndarray, d_src: int, args: argparse.Namespace
) -> tuple[np.ndarray, np.ndarray]:
    """``--general-from``: a share of the training rows of that pair moved out of training,
    for the confidence head only. Returns (training rows, general rows)."""
    from lead.confidence import MIN_HELD_OUT_ROWS, head_rows_problem

    pair = args.general_from
    if pair is None:
        if args.general_holdout is not None:
            raise InvalidInputError(
                "--general-holdout needs --general-from", param="general_holdout"
            )
        return train, np.arange(0)
    share = _general_share(args)
    if args.holdout_from is None or not 1 <= pair <= len(sizes) or pair == args.holdout_from:
        raise InvalidInputError(
            f"--general-from must be between 1 and {len(sizes)} and name another pair than "
            "--holdout-from (which it needs: the held-out rows come from your domain, the "
            "general rows from outside it)",
            param="general_from",
        )
    if not args.confidence or args.holdout == 0 or not 0 < share < 1:
        raise InvalidInputError(
            "--general-from needs the confidence head (no --no-confidence, a --holdout "
            "above 0) and --general-holdout in (0, 1)",
            param="general_holdout",
        )
    offset = int(sum(sizes[: pair - 1]))
    inside = train[(train >= offset) & (train < offset + sizes[pair - 1])]
    order = np.random.default_rng(args.seed).permutation(len(inside))
    general = np.sort(inside[order[: round(len(inside) * share)]])
    if len(general) < MIN_HELD_OUT_ROWS:
        raise InvalidInputError(
            f"--general-holdout {share} of pair {pair} leaves {len(general)} "
            f"general rows; the confidence head needs at least {MIN_HELD_OUT_ROWS}",
            param="general_holdout",
        )
    train = np.setdiff1d(train, general)
    problem = head_rows_problem(len(train), len(test), d_src)
    if problem is not None:  # the general rows would leave training for nothing
        raise InvalidInputError(f"--general-from: {problem}", param="general_from")
    return train, general


def _score(
    stitch: Any, X: np.ndarray, Y: np.ndarray, train_mean: Any, reverse: Any = None
) -> dict[str, Any]:
    from lead.scorecard import score_stitch

    card = score_stitch(stitch, X, Y, target_train_mean=train_mean, reverse=reverse)
    return card.to_dict()


#: Fit stages shown as a progress bar, and the unit of their steps: an MLP's training
#: epochs, and the refinement rounds of an unpaired fit (a minute on 5,000 rows a side).
_BAR_UNITS = {"train": "epoch", "refine": "round"}


def _tqdm_progress() -> tuple[Callable[[str, int, int], None], Callable[[], None]]:
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def progress(stage: str, step: int, total: int) -> None:
        unit = _BAR_UNITS.get(stage)
        if unit is None:  # closed-form fits take seconds: no bar
            return
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=total, desc=stage, unit=unit, file=sys.stderr)
        bar.total = total  # lowered to the epochs run when early stopping ends training
        bar.update(step - bar.n)

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return progress, close


def _holdout_ids(
    path: str | None, sizes: Sequence[int], holdout_from: int | None, test: np.ndarray
) -> list[str] | None:
    """The ids of the held-out rows, read from a JSON list for the held-out pair."""
    if path is None:
        return None
    try:
        ids = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"--ids {path}: not a readable JSON list ({exc})") from None
    except RecursionError:  # json's parser recurses once per level
        raise InvalidInputError(
            f"--ids {path}: not a JSON list of ids (nested too deeply)", param="ids"
        ) from None
    pair = (holdout_from or 1) - 1
    rows = sizes[pair] if holdout_from is not None else sum(sizes)
    if not isinstance(ids, list) or len(ids) != rows:
        raise ShapeMismatchError(
            f"--ids {path} must be a JSON list of {rows} ids, one per row",
            expected=rows,
            got=len(ids) if isinstance(ids, list) else type(ids).__name__,
            param="ids",
        )
    offset = int(sum(sizes[:pair])) if holdout_from is not None else 0
    return [str(ids[i - offset]) for i in test]


def _info_from(args: argparse.Namespace, fit: dict[str, Any]) -> Any:
    """The :class:`~lead.stitches.StitchInfo` of the model arguments, with ``fit``."""
    from lead.stitches import StitchInfo

    return StitchInfo(
        source_model=args.source_model,
        target_model=args.target_model,
        source_normalized=args.source_normalized,
        target_normalized=args.target_normalized,
        source_revision=args.source_revision,
        target_revision=args.target_revision,
        fit=fit,
    )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source-model", required=True, type=text_argument, help="source model id")
    parser.add_argument("--target-model", required=True, type=text_argument, help="target model id")
    parser.add_argument("--source-revision")
    parser.add_argument("--target-revision")
    for flag in ("source-normalized", "target-normalized"):
        parser.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--normalize-output",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="L2-normalise outputs (default: as --target-normalized)",
    )


def _fit_with_progress(
    X: Any, Y: Any, method: str, info: Any, args: argparse.Namespace, sample_weight: Any = None
) -> Any:
    """:func:`lead.fit_stitch` with the command's seed, options and a progress bar."""
    from lead.fitting import fit_stitch

    progress, close = _tqdm_progress()
    try:
        return fit_stitch(
            X,
            Y,
            method,
            info=info,
            normalize_output=args.normalize_output,
            seed=args.seed,
            progress=progress,
            sample_weight=sample_weight,
            calibrate_variance=getattr(args, "calibrate_variance", False),
            **parse_option_items(args.option),
        )
    finally:
        close()


def _row_weights(weights: list[float] | None, sizes: Sequence[int]) -> np.ndarray | None:
    """One weight per row from ``--weight`` (one per ``--source``/``--target`` pair)."""
    if weights is None:
        return None
    if len(weights) != len(sizes):
        raise InvalidInputError(
            f"{len(weights)} --weight for {len(sizes)} --source/--target pairs; give one per pair",
            param="weight",
        )
    return np.repeat(np.asarray(weights, dtype=np.float64), sizes)


def _check_out(args: argparse.Namespace) -> None:
    """Refuse an ``--out`` folder that exists and is not empty, unless ``--force`` (before
    any fitting; :func:`lead.artifacts.save_stitch` checks again when it renames)."""
    from lead.artifacts import check_replaceable

    out = Path(args.out)
    if args.force:  # a plain file or another folder was refused after the whole fit
        check_replaceable(out)
        return
    if not out.exists():
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    what = "a stitch" if (out / "config.json").is_file() else "files"
    raise ConflictError(
        f"--out {out} exists already and holds {what}; pass --force to replace it, or "
        "choose another folder",
        param="out",
    )


def _fit(args: argparse.Namespace) -> int:
    from lead.artifacts import STORAGE_DTYPES, check_storable, save_stitch
    from lead.confidence import note_no_confidence

    if not 0 <= args.holdout < 1:
        raise InvalidInputError("--holdout must be in [0, 1)", param="holdout")
    _check_out(args)
    xs, ys = _load_pairs(args.source, args.target)
    X, Y = np.concatenate(xs), np.concatenate(ys)
    train, test = _split_rows([len(x) for x in xs], args.holdout, args.seed, args.holdout_from)
    holdout_ids = _holdout_ids(args.ids, [len(x) for x in xs], args.holdout_from, test)
    train, general = _general_rows([len(x) for x in xs], train, test, X.shape[1], args)
    info = _info_from(
        args,
        {
            "data": [
                {"source": s, "target": t, "rows": len(x)}
                for s, t, x in zip(args.source, args.target, xs, strict=True)
            ],
            "holdout": {
                "fraction": args.holdout,
                "seed": args.seed,
                "from_pair": args.holdout_from,
                "train_pairs": len(train),
                "test_pairs": len(test),
                **({"ids": holdout_ids} if holdout_ids is not None else {}),
                **(
                    {
                        "general": {
                            "from_pair": args.general_from,
                            "fraction": _general_share(args),
                            "pairs": len(general),
                        }
                    }
                    if len(general)
                    else {}
                ),
            },
        },
    )
    weights = _row_weights(args.weight, [len(x) for x in xs])
    stitch = _fit_with_progress(
        X[train], Y[train], args.method, info, args, None if weights is None else weights[train]
    )
    if args.save_dtype != "float32":  # score exactly the values that will be stored
        check_storable(stitch, args.save_dtype)  # not "the stitch produced NaN" after rounding
        stitch.to(STORAGE_DTYPES[args.save_dtype]).float()
    if len(test):
        stitch.info.scorecard = _score(stitch, X[test], Y[test], Y[train].mean(axis=0))
    if len(test) and args.confidence:
        _attach_confidence(stitch, (X, Y), train, test, general, args.seed)
    else:
        note_no_confidence(
            stitch,
            "it was fitted with --no-confidence"
            if len(test)
            else "it was fitted without held-out pairs (--holdout 0)",
        )
    save_stitch(stitch, args.out, dtype=args.save_dtype, overwrite=args.force)
    print(json.dumps(stitch.info.scorecard, indent=2))
    if not len(test):  # the bare "null" above said nothing of why
        sys.stderr.write(
            f"note: nothing was held out (--holdout 0), so the stitch in {args.out} has no "
            "scorecard; `lead score` scores it on pairs it was not fitted on\n"
        )
    _warn_below_baseline(stitch.info.scorecard)
    return 0


def _attach_confidence(
    stitch: Any,
    pairs: tuple[np.ndarray, np.ndarray],
    train: np.ndarray,
    test: np.ndarray,
    general: np.ndarray,
    seed: int,
) -> None:
    """Fit the per-vector confidence head on the held-out (and general) rows and say how
    well it ranks (or why there is none)."""
    from lead.confidence import MIN_HELD_OUT_ROWS, fit_confidence, note_no_confidence

    X, Y = pairs
    try:
        report = fit_confidence(
            stitch,
            X[train],
            Y[train],
            X[test],
            Y[test],
            X_general=X[general] if len(general) else None,
            Y_general=Y[general] if len(general) else None,
            seed=seed,
        )
    except TooFewPairsError as error:
        held = error.got == len(test) and error.minimum == MIN_HELD_OUT_ROWS
        hint = "raise --holdout" if held else "give more training pairs"
        note_no_confidence(stitch, str(error))
        sys.stderr.write(f"note: no confidence head ({error}); {hint} to get one\n")
        return
    general_part = (
        f", {report['out_of_domain_spearman_score']:.3f} on {report['general_rows']} general rows"
        if "out_of_domain_spearman_score" in report
        else ""
    )
    sys.stderr.write(
        f"confidence: Spearman(confidence, true cosine) {report['in_domain_spearman_score']:.3f} "
        f"on {report['held_out_rows']} held-out rows{general_part} (out of fold)\n"
    )


def _warn_below_baseline(scorecard: dict[str, Any] | None) -> None:
    """Say so on stderr when the held-out R² is at or below the mean-estimator baseline
    (a job would keep such a stitch but not serve it)."""
    from lead.scorecard import below_baseline_cause

    if scorecard is None:
        return
    r2 = scorecard.get("r2_score")
    if r2 is None or r2 > 0:
        return
    sys.stderr.write(
        f"warning: held-out r2_score {r2:.3f} is at or below the mean-estimator baseline (0): "
        f"the stitch predicts the target no better than the training mean. "
        f"{below_baseline_cause(scorecard)}. A job would keep this stitch but not serve it.\n"
    )


def _fit_unpaired(args: argparse.Namespace) -> int:
    from lead.artifacts import save_stitch
    from lead.data import read_embeddings

    _check_out(args)
    X, Y = read_embeddings(args.source), read_embeddings(args.target)
    info = _info_from(args, {"data": {"source": args.source, "target": args.target}})
    stitch = _fit_with_progress(X, Y, "unsupervised", info, args)
    save_stitch(stitch, args.out, overwrite=args.force)
    for warning in stitch.info.fit.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    print(json.dumps(stitch.info.fit, indent=2))
    return 0


def _check_stitch_dims(stitch: Any, args: argparse.Namespace, d_src: int, d_tgt: int) -> None:
    """The ``--source`` / ``--target`` files must have the stitch's dimensions; an error
    names the files, the stitch's models and a likely swap."""
    swapped = (d_src, d_tgt) == (stitch.d_tgt, stitch.d_src)
    sides = (
        ("--source", args.source, d_src, stitch.d_src, stitch.info.source_model),
        ("--target", args.target, d_tgt, stitch.d_tgt, stitch.info.target_model),
    )
    for flag, files, got, expected, model in sides:
        if got != expected:
            raise ShapeMismatchError(
                f"the {flag} file{'s' if len(files) > 1 else ''} ({', '.join(files)}) "
                f"{'have' if len(files) > 1 else 'has'} {got} columns but the stitch expects "
                f"{expected} ({model})"
                + ("; did you swap --source and --target?" if swapped else ""),
                expected=expected,
                got=got,
                param=flag[2:],
            )


def _score_command(args: argparse.Namespace) -> int:
    from lead.artifacts import load_stitch

    if args.all and (args.holdout is not None or args.holdout_from is not None):
        # each was ignored, and the scorecard read as that split's
        raise InvalidInputError(
            "--all scores every row: drop --holdout and --holdout-from", param="all"
        )
    stitch = load_stitch(args.stitch, device=args.device)
    reverse = None if args.reverse is None else load_stitch(args.reverse, device=args.device)
    xs, ys = _load_pairs(args.source, args.target)
    _check_stitch_dims(stitch, args, xs[0].shape[1], ys[0].shape[1])
    X, Y = np.concatenate(xs), np.concatenate(ys)
    if args.all:
        mean = stitch.target_mean.detach().cpu().double().numpy()
        scorecard = _score(stitch, X, Y, mean, reverse)
    else:
        holdout = 0.2 if args.holdout is None else args.holdout
        train, test = _split_rows([len(x) for x in xs], holdout, args.seed, args.holdout_from)
        if not len(test):
            raise InvalidInputError("--holdout must be in (0, 1), or use --all", param="holdout")
        scorecard = _score(stitch, X[test], Y[test], Y[train].mean(axis=0), reverse)
    print(json.dumps(scorecard, indent=2))
    return 0


def _translate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from lead._durable import atomic_write
    from lead.data import SUFFIXES, EmbeddingReader, EmbeddingWriter, parse_spec
    from lead.migrate.translator import LocalTranslator
    from lead.unit_input import expects_unit_input

    # before the stitch is loaded and the progress bar shown
    if args.batch_size < 1:
        raise InvalidInputError("--batch-size must be at least 1", param="batch_size")
    if parse_spec(args.output)[0].suffix.lower() not in SUFFIXES:
        raise InvalidInputError(
            f"--output {args.output}: output must be .npy or .safetensors", param="output"
        )
    for flag, spec in (("output", args.output), ("confidence-output", args.confidence_output)):
        path = None if spec is None else parse_spec(spec)[0]  # out.safetensors:tensor
        if path is not None and path.exists() and not args.force:
            raise ConflictError(
                f"--{flag} {path} exists already; pass --force to replace it, or choose "
                "another file",
                param=flag.replace("-", "_"),
            )
    if args.confidence_output is not None and not str(args.confidence_output).endswith(".npy"):
        raise InvalidInputError(
            "--confidence-output must be a .npy file", param="confidence_output"
        )
    if args.confidence_output is not None and (
        Path(args.confidence_output).resolve() == Path(args.output).resolve()
    ):  # else one file would silently replace the other
        raise InvalidInputError(
            "--confidence-output must be another file than --output", param="confidence_output"
        )
    if args.confidence_output is not None and (
        Path(args.confidence_output).resolve() == parse_spec(args.input)[0].resolve()
    ):  # with --force it replaced the vectors with their confidences
        raise InvalidInputError(
            "--confidence-output must be another file than --input", param="confidence_output"
        )
    # the same bytes as the service answers, whatever --batch-size (batch-invariant)
    translator = LocalTranslator(args.stitch, inverse=args.inverse, device=args.device)
    ref = translator.ref
    scored = args.confidence_output is not None
    if scored:  # refused before anything is written
        translator.require_confidence()
    reader = EmbeddingReader(args.input)
    if reader.shape[1] != ref.d_in:
        raise ShapeMismatchError(
            f"{args.input} has dimension {reader.shape[1]}, the stitch expects {ref.d_in}",
            expected=ref.d_in,
            got=reader.shape[1],
            param="input",
        )
    meta = {
        "stitch": str(args.stitch),
        "direction": "inverse" if args.inverse else "forward",
        "source_model": ref.source_model,
        "target_model": ref.target_model,
        "source_file": str(args.input),
    }
    n, rescaled = len(reader), 0
    confidence = np.empty(n if scored else 0, dtype=np.float32)
    flagged = 0
    with (
        EmbeddingWriter(args.output, n, ref.d_out, metadata=meta) as writer,
        tqdm(total=n, unit="vec", desc="translate", file=sys.stderr) as bar,
    ):
        for start, rows in reader.iter_batches(args.batch_size):
            try:
                if scored:
                    out, count, conf, ood = translator.translate_scored(rows)
                    confidence[start : start + len(rows)] = conf
                    flagged += int(ood.sum())
                else:
                    out, count = translator.translate(rows)
            except ZeroVectorError as error:
                row = start + error.row
                raise ZeroVectorError(
                    f"row {row} of {args.input} is a zero vector; the stitch was fitted on "
                    "unit-length vectors and scales each input to unit length",
                    row=row,
                    param=f"input[{row}]",
                ) from None
            except NonFiniteOutputError:
                raise NonFiniteOutputError(
                    f"the stitch produced NaN or infinity near row {start}"
                ) from None
            rescaled += count
            writer.write(out)
            bar.update(len(rows))
        if scored:  # written before the vectors' file is renamed into place
            atomic_write(args.confidence_output, lambda handle: np.save(handle, confidence))
    summary: dict[str, Any] = {
        "output": str(args.output),
        "rows": n,
        "dim": ref.d_out,
        "input_normalized": expects_unit_input(translator.stitch, inverse=args.inverse),
        "rescaled_inputs": rescaled,
    }
    if scored:
        summary["confidence_output"] = str(args.confidence_output)
        summary["out_of_distribution"] = flagged
        if flagged:
            sys.stderr.write(
                f"warning: {flagged} of {n} rows are far outside the stitch's training "
                "inputs (out of distribution); their translations are unreliable\n"
            )
    print(json.dumps(summary))
    return 0


def _add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        action="append",
        required=True,
        metavar="FILE[:TENSOR]",
        help="source-model vectors (.safetensors[:tensor] or .npy); repeat to add datasets",
    )
    parser.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="FILE[:TENSOR]",
        help="target-model vectors, row i pairs with row i of the matching --source",
    )
    parser.add_argument("--holdout", type=float, default=0.2, help="held-out share (default 0.2)")
    parser.add_argument(
        "--holdout-from",
        type=int,
        metavar="N",
        help="draw the held-out rows from the N-th --source/--target pair only (1-based); "
        "the other pairs are training-only",
    )
    parser.add_argument(
        "--seed", type=seed_argument, default=0, help="seed of the split and the fit"
    )


def _add_out_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        required=True,
        type=text_argument,
        help="folder to save the stitch in (new, or empty)",
    )
    parser.add_argument("--force", action="store_true", help="replace a stitch already in --out")


def build_parser() -> argparse.ArgumentParser:
    """The ``lead`` argument parser; each subcommand sets ``handler(args) -> int``."""
    parser = CommandParser(
        prog="lead", description="LEAD: fit, score and apply embedding stitches."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    fit = commands.add_parser("fit", help="fit a stitch on paired embeddings and save it")
    _add_pair_arguments(fit)
    fit.add_argument(
        "--method",
        default="ridge",
        help=FIT_METHODS_HELP,
    )
    fit.add_argument(
        "--calibrate-variance",
        action="store_true",
        help="after the fit, scale translated residuals to the native spread of the targets "
        "(a corpus mixing translated and natively re-embedded vectors then never retrieves "
        "worse than a fully translated one; see lead.calibration)",
    )
    fit.add_argument(
        "--weight",
        action="append",
        type=float,
        metavar="W",
        help="weight of the rows of each --source/--target pair, in their order (methods "
        "local and gated): e.g. 1 for your documents and queries, 0.05 for general-domain "
        "extra pairs",
    )
    fit.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='method option, value parsed as JSON (alpha=0.01, scaling=true, loss="cosine")',
    )
    _add_model_arguments(fit)
    fit.add_argument(
        "--ids",
        metavar="FILE",
        help="JSON list of row ids (document ids) of the pair the held-out rows come from; "
        "the held-out ids are then listed in the stitch's config and model card",
    )
    fit.add_argument(
        "--save-dtype",
        choices=("float32", "float16", "bfloat16"),
        default="float32",
        help="storage dtype of the saved tensors (float16 halves the folder; the scorecard is "
        "computed on the rounded values)",
    )
    fit.add_argument(
        "--general-from",
        type=int,
        metavar="N",
        help="move --general-holdout of the N-th --source/--target pair (general text, e.g. "
        "everyday sentences beside your documents) out of training, for the confidence head "
        "only: it then also ranks inputs outside your domain, and reports how well "
        "(out_of_domain_spearman_score)",
    )
    fit.add_argument(
        "--general-holdout",
        type=float,
        metavar="F",
        help="share of the --general-from pair moved out of training (default 0.1)",
    )
    fit.add_argument(
        "--no-confidence",
        dest="confidence",
        action="store_false",
        help="do not attach the per-vector confidence head (fitted on the held-out rows by "
        "default; needs at least 50 of them)",
    )
    _add_out_arguments(fit)
    fit.set_defaults(handler=_fit)

    unpaired = commands.add_parser(
        "fit-unpaired",
        help="fit a stitch from unpaired embeddings (method unsupervised: no pairs needed)",
    )
    unpaired.add_argument("--source", required=True, metavar="FILE[:TENSOR]")
    unpaired.add_argument(
        "--target",
        required=True,
        metavar="FILE[:TENSOR]",
        help="target-model vectors of other texts (or the same in any order; any row count)",
    )
    unpaired.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option of lead.unsupervised.fit_unsupervised, value parsed as JSON "
        "(sample_size=1000, rounds=40, ...)",
    )
    unpaired.add_argument("--seed", type=seed_argument, default=0)
    _add_model_arguments(unpaired)
    _add_out_arguments(unpaired)
    unpaired.set_defaults(handler=_fit_unpaired)

    score = commands.add_parser(
        "score",
        help="score a stitch on paired embeddings",
        description="Score a stitch on paired embeddings: by default on the held-out split "
        "that --holdout and --seed give these files (the split lead fit made, when they are "
        "the files it was fitted on, in the same order), R² against the mean of the other "
        "rows of --target; with --all on every row, R² against the stitch's own training "
        "mean. A stitch card's figures come from its own fit data: scored on other files, "
        "or on the same ones in another order, they differ.",
    )
    score.add_argument("stitch", help=STITCH_ARGUMENT_HELP)
    _add_pair_arguments(score)
    score.add_argument("--all", action="store_true", help="score on every row (no split)")
    score.set_defaults(holdout=None)  # None: not given (0.2), which --all needs
    score.add_argument(
        "--reverse",
        metavar="STITCH",
        help="a stitch from the target model back to the source model: the scorecard then "
        "holds the round trip (invertible stitches round-trip through their inverse anyway)",
    )
    score.add_argument("--device", default="cpu")
    score.set_defaults(handler=_score_command)

    translate = commands.add_parser("translate", help="translate an embedding file")
    translate.add_argument("stitch", help=STITCH_ARGUMENT_HELP)
    translate.add_argument("--input", required=True, metavar="FILE[:TENSOR]")
    translate.add_argument(
        "--output", required=True, type=text_argument, metavar="FILE", help=".npy or .safetensors"
    )
    translate.add_argument(
        "--force", action="store_true", help="replace an --output file that exists already"
    )
    translate.add_argument(
        "--confidence-output",
        metavar="FILE.npy",
        help="also write each row's confidence (float32 in [0, 1], a calibrated estimate of "
        "its cosine with the target model's own vector) and count the rows out of "
        "distribution; needs a stitch with a confidence head",
    )
    translate.add_argument(
        "--batch-size",
        type=int,
        default=4096,
        help="rows read and translated at a time (4096); the output is the same bytes "
        "whatever it is",
    )
    translate.add_argument(
        "--inverse",
        action="store_true",
        help="run an invertible stitch backwards (target-model vectors in, source-model out)",
    )
    translate.add_argument("--device", default="cpu")
    translate.set_defaults(handler=_translate)

    from lead._remote_cli import add_remote_commands  # datasets, jobs, align (on a server)
    from lead.migrate.cli import add_migrate_commands  # migrate a vector store

    add_remote_commands(commands)
    add_migrate_commands(commands)
    return parser


def _os_error_message(error: OSError) -> str:
    """``[Errno 30] Read-only file system: 'out.npy'`` as ``out.npy: read-only file
    system``."""
    reason = (error.strerror or str(error)).lower()
    if error.filename is None:
        return reason
    names = [str(error.filename)] + ([] if error.filename2 is None else [str(error.filename2)])
    return f"{' -> '.join(names)}: {reason}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lead`` command line; returns the exit status: 2 for any error (a LEAD
    error, a file that cannot be read or written), so that 1 keeps its meanings of a
    check that did not pass (``migrate plan`` / ``calibrate`` / ``verify``, a failed job)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2)
        return exit_.code if isinstance(exit_.code, int) else 2
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except LeadError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout closed early (| head): not an error of ours
        # (before OSError, its base class); the exit's flush of stdout would fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as error:  # a file named on the command line: missing, read-only, full...
        print(f"error: {_os_error_message(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

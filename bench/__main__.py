"""Run the LEAD bench: ``python -m bench [--quick]`` from the repository root.

Sections run one after another (no timing overlaps another measurement): translate
throughput, a py-spy profile of the service, migration cost, fitting cost, then quality,
learning curve and alignment (two worker processes), fidelity to the information bound
(learning curve over K, progressive migration, out-of-domain proxy; ``bench/fidelity.py``);
finally ``bench/results/SUMMARY.md``.
A ``--quick`` run writes to ``bench/results/quick/`` (git-ignored) instead, so that it never
overwrites the committed results of a full run.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench.common import (
    QUICK_RESULTS,
    RESULTS,
    Section,
    log,
    machine,
    read_result,
    results_dir,
    use_results_dir,
    write_result,
)
from bench.data import REPO, data_dir
from bench.quality import ordered_pairs

#: The bundled stitches the fidelity section measures (bench/fidelity.py: BUNDLED).
BUNDLED_STITCHES = (
    "minilm-to-mpnet",
    "minilm-to-e5",
    "minilm-to-pml3",
    "mpnet-to-minilm",
    "e5-to-minilm",
)

SECTIONS = ("throughput", "profile", "migration", "fitcost", "quality", "fidelity", "report")

# budgets: the whole full run must stay under 20 minutes on 2 cores
FULL: dict[str, Any] = {
    "batches": (1, 32, 1024, 8192),
    "in_process_time": 1.0,
    "http_time": 2.0,
    "acceptance_rounds": 3,
    "reembed_docs": 200,
    "translate_repeats": 3,
    "fit_sizes": (1000, 5000, 20000),
    "fit_methods": {
        "ridge": {},
        "procrustes": {},
        "mlp": {"max_epochs": 3},
        "local": {},
        "gated": {"max_epochs": 3},
    },
    "pairs": ordered_pairs(),
    "methods": {"ridge": {}, "procrustes": {}},
    "mlp_options": {},
    "mlp_pairs": ordered_pairs(),
    "mlp_crossfit_pairs": [("minilm", "mpnet"), ("mpnet", "minilm"), ("glove", "minilm")],
    "curve_pairs": [("minilm", "mpnet"), ("minilm", "e5"), ("pml3", "minilm"), ("glove", "minilm")],
    "curve_sizes": (250, 1000, 2000, 4000),
    "curve_methods": {"ridge": {}, "procrustes": {}},
    "align_models": ("minilm", "mpnet", "e5", "pml3", "glove"),
    # fidelity to the bound (bench/fidelity.py)
    "fid_curve_pairs": [("minilm", "mpnet"), ("minilm", "e5"), ("minilm", "pml3")],
    "fid_curve_sizes": (250, 500, 1000, 2000, 4000),
    # gated: the bundled stitches' method (on a bundled pair with that stitch's own options,
    # fidelity.curve_options: 2,048 MLP units from and into MiniLM and mpnet), and the MLP
    # they replaced; one seed each
    "fid_curve_methods": {
        "ridge": {},
        "procrustes": {},
        "mlp": {"hidden_dim": 512, "max_epochs": 8, "patience": 2},
        "gated": {"hidden_dim": 512, "max_epochs": 8, "patience": 2},
    },
    "fid_curve_seeds": 3,
    "fid_curve_seeds_by_method": {"mlp": 1, "gated": 1},
    "fid_progressive_ids": list(BUNDLED_STITCHES),
    "fid_progressive_extra": {"ridge": {}, "procrustes": {}},
    "fid_progressive_extra_ids": ["minilm-to-mpnet", "minilm-to-e5"],
    "fid_fractions": (0.0, 0.05, 0.1, 0.2, 0.5, 1.0),
    "fid_mix_seeds": 5,
    "fid_ood_sentences": 2000,
    "fid_method_options": {},
}
QUICK: dict[str, Any] = {
    **FULL,
    "batches": (1, 32, 1024),
    "in_process_time": 0.2,
    "http_time": 0.5,
    "acceptance_rounds": 1,
    "reembed_docs": 8,
    "translate_repeats": 1,
    "fit_sizes": (1000,),
    "fit_methods": {
        "ridge": {},
        "procrustes": {},
        "mlp": {"max_epochs": 2},
        "local": {},
        "gated": {"max_epochs": 2},
    },
    "pairs": [("minilm", "mpnet"), ("pml3", "minilm")],
    "mlp_options": {"max_epochs": 2},
    "mlp_pairs": [("minilm", "mpnet")],
    "mlp_crossfit_pairs": [("minilm", "mpnet")],
    "curve_pairs": [("minilm", "mpnet")],
    "curve_sizes": (250, 1000),
    "align_models": ("minilm", "mpnet", "pml3"),
    "fid_curve_pairs": [("minilm", "pml3")],
    "fid_curve_sizes": (250, 1000),
    "fid_curve_methods": {"ridge": {}},
    "fid_curve_seeds": 1,
    "fid_curve_seeds_by_method": {},
    "fid_progressive_ids": ["minilm-to-pml3"],
    "fid_progressive_extra": {"procrustes": {}},
    "fid_progressive_extra_ids": ["minilm-to-e5"],
    "fid_mix_seeds": 2,
    "fid_ood_sentences": 300,
    "fid_method_options": {"mlp": {"max_epochs": 1}},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run with small sizes")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})",
    )
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="skip the py-spy profile unless the HTTP acceptance figure fails",
    )
    parser.add_argument(
        "--embed-venv",
        type=Path,
        default=REPO / ".venv-embed",
        help="virtualenv with the offline embedding models",
    )
    parser.add_argument(
        "--embed-models",
        type=Path,
        default=REPO / ".embed-models",
        help="folder holding all-mpnet-base-v2",
    )
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    args.results = QUICK_RESULTS if args.quick else RESULTS
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s): {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if not (data_dir() / "scifact" / "embeddings").is_dir():
        raise SystemExit(f"the real data is missing: {data_dir()} (set LEAD_SHARED_DATA)")
    use_results_dir(args.results)
    where = f"{args.results.relative_to(REPO)}/"
    if args.quick:
        where += " (a quick run: the committed full-run results in bench/results/ are untouched)"
    log(f"results go to {where}")
    start = time.perf_counter()
    full = args.sections == list(SECTIONS)
    previous = None if full else read_result("run")
    run = previous or {"sections": {}, "quick": args.quick, "machine": machine()}
    fraction_fails = False

    if "throughput" in args.sections:
        from bench import throughput

        with Section("throughput") as sec:
            result = throughput.run(
                batches=cfg["batches"],
                in_process_time=cfg["in_process_time"],
                http_time=cfg["http_time"],
                acceptance_rounds_n=cfg["acceptance_rounds"],
            )
        result["acceptance"] = throughput.acceptance(result)
        result["arrow_fractions"] = throughput.arrow_fractions(result)
        arrow = result["arrow_fractions"]
        log(f"Arrow at batch {result['arrow_batch']}: fraction of in-process {arrow}")
        fraction_fails = not result["acceptance"]["passes"]
        write_result("throughput", {**result, "section": sec.info})
        run["sections"]["throughput"] = sec.info

    explicit = args.sections != list(SECTIONS)
    wanted = fraction_fails or explicit or not (args.no_profile or args.quick)
    if "profile" in args.sections and wanted:
        from bench import pyspy_profile as profile

        with Section("profile") as sec:
            # one client: each sample is attributed cleanly (no GIL hand-offs between requests)
            result = profile.run(seconds=3 if args.quick else 6, concurrency=1)
            small = profile.run(batch=1, seconds=3 if args.quick else 4)
            stages = [
                profile.stage_breakdown(stitch_id, 1024, encoding)
                for stitch_id in ("pml3-to-minilm-ridge", "minilm-to-mpnet-ridge")
                for encoding in ("base64", "float")
            ]
        write_result(
            "profile",
            {
                "profile": result,
                "profile_batch_1": small,
                "serial_stages": stages,
                "section": sec.info,
            },
        )
        run["sections"]["profile"] = sec.info

    if "migration" in args.sections:
        from bench import migration

        with Section("migration") as sec:
            result = migration.run(
                sample_docs=cfg["reembed_docs"],
                embed_python=args.embed_venv.absolute() / "bin" / "python",
                mpnet_dir=(args.embed_models / "all-mpnet-base-v2").absolute(),
                repeats=cfg["translate_repeats"],
            )
        write_result("migration", {**result, "section": sec.info})
        run["sections"]["migration"] = sec.info

    if "fitcost" in args.sections:
        from bench import fitcost

        with Section("fitcost") as sec:
            result = fitcost.run(sizes=cfg["fit_sizes"], methods=cfg["fit_methods"])
        write_result("fitcost", {**result, "section": sec.info})
        run["sections"]["fitcost"] = sec.info

    if "quality" in args.sections:
        from bench import quality

        with Section("quality, learning curve, alignment") as sec:
            result = quality.run(
                pairs=cfg["pairs"],
                methods=cfg["methods"],
                mlp_pairs=cfg["mlp_pairs"],
                mlp_options=cfg["mlp_options"],
                mlp_crossfit_pairs=cfg["mlp_crossfit_pairs"],
                curve_pairs=cfg["curve_pairs"],
                curve_sizes=cfg["curve_sizes"],
                curve_methods=cfg["curve_methods"],
                align_models=cfg["align_models"],
            )
        for name, payload in result.items():
            write_result(name, {**payload, "section": sec.info})
        run["sections"]["quality"] = sec.info

    if "fidelity" in args.sections:
        from bench import fidelity

        with Section("fidelity: learning curve, progressive migration, out of domain") as sec:
            result = fidelity.run(
                curve_pairs=cfg["fid_curve_pairs"],
                curve_sizes=cfg["fid_curve_sizes"],
                curve_methods=cfg["fid_curve_methods"],
                curve_seeds=cfg["fid_curve_seeds"],
                progressive_ids=cfg["fid_progressive_ids"],
                progressive_extra=cfg["fid_progressive_extra"],
                progressive_extra_ids=cfg["fid_progressive_extra_ids"],
                fractions=cfg["fid_fractions"],
                mix_seeds=cfg["fid_mix_seeds"],
                ood_ids=cfg["fid_progressive_ids"],
                ood_sentences=cfg["fid_ood_sentences"],
                method_options=cfg["fid_method_options"],
                curve_seeds_by_method=cfg["fid_curve_seeds_by_method"],
            )
        write_result("fidelity", {**result, "section": sec.info})
        run["sections"]["fidelity"] = sec.info

    started = os.environ.get("BENCH_STARTED_AT")  # set by bench/run.sh: setup included
    elapsed = time.time() - float(started) if started else time.perf_counter() - start
    if previous is None:
        run["total_seconds"] = round(elapsed, 1)
    elif args.sections != ["report"]:
        # a partial re-run keeps the full run's total and says what was redone
        run.setdefault("partial_reruns", []).append(
            {"sections": args.sections, "seconds": round(elapsed, 1), "machine": machine()}
        )
    write_result("run", run)
    if "report" in args.sections:
        from bench import report

        report.write_summary()
        print(f"\nwrote {results_dir() / 'SUMMARY.md'}")
    print(f"bench finished in {time.perf_counter() - start:.0f} s; results in {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

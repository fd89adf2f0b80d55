"""Check the running service against ``openapi.yaml`` with Schemathesis, every check on.

``python scripts/contract.py [--seconds 60]`` starts the real service twice on loopback
(the bundled stitches, jobs enabled): once without API keys and once with keys, and runs
``schemathesis run --checks all`` against each for at most ``--seconds`` (all phases:
examples, coverage, fuzzing, stateful). With keys, Schemathesis sends the admin key and
checks that requests without a key, or with a wrong one, get 401. Exits non-zero when
either run reports a failure. ``schemathesis.toml`` holds the per-operation settings (why
some schema-valid requests may still be refused is written there).

First it checks that the committed ``openapi.yaml`` is the schema the keyed server serves,
so the contract Schemathesis tests is the one in the repository.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import yaml
from _harness import REPO, Server

ADMIN_KEY = "contract-admin-key"
TRANSLATE_KEY = "contract-translate-key"


def bundled_stitches() -> list[str]:
    models = REPO / "models"
    return sorted(str(p) for p in models.iterdir() if (p / "config.json").is_file())


def run_schemathesis(server: Server, seconds: int, key: str | None, report: Path, seed: int) -> int:
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        "all",
        "--max-time",
        str(seconds),
        "--workers",
        "1",
        "--report",
        "junit",
        "--report-dir",
        str(report),
        "--seed",
        str(seed),
    ]
    if key is not None:
        command += ["--header", f"Authorization: Bearer {key}"]
    print(f"contract: {' '.join(command[1:3])} ({'keys on' if key else 'keys off'})", flush=True)
    return subprocess.run(command, cwd=REPO, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/contract.py", description=__doc__)
    parser.add_argument("--seconds", type=int, default=60, help="budget of each run")
    parser.add_argument("--seed", type=int, default=1, help="Schemathesis' seed (CI: 1)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="lead-contract-"))
    failures = 0
    try:
        for keys in (False, True):
            env = {"LEAD_STITCHES": json.dumps(bundled_stitches()), "LEAD_JOB_WORKERS": "1"}
            if keys:
                env["LEAD_API_KEYS"] = f"{ADMIN_KEY}:admin,{TRANSLATE_KEY}:translate"
            server = Server(work / ("keys" if keys else "open") / "data", **env)
            if not keys:  # no keys: the variable unset ("[]" is refused, as a template's slip)
                server.env.pop("LEAD_API_KEYS", None)
            server.data_dir.mkdir(parents=True)
            server.start()
            try:
                if keys:
                    served = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
                    committed = yaml.safe_load((REPO / "openapi.yaml").read_text("utf-8"))
                    if served != committed:
                        print("contract: openapi.yaml is not the served schema", flush=True)
                        failures += 1
                key = ADMIN_KEY if keys else None
                status = run_schemathesis(server, args.seconds, key, work / "reports", args.seed)
                failures += status != 0
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"contract: {'FAILED' if failures else 'passed'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

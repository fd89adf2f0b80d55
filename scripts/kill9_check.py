"""kill -9 the server in the middle of training jobs, restart it, and check nothing is lost.

1. Start uvicorn (temporary LEAD_DATA_DIR), upload the SciFact minilm → e5 pairs, run a
   ridge job to the end (the earlier result), submit a long MLP job and ``kill -9`` the
   server once it trains. Check: the training worker exits by itself, no stitch folder of
   the killed job exists, and after a restart the job is ``failed`` / ``interrupted`` while
   the earlier job, its scorecard and its stitch files are unchanged and served.
2. ``--rounds`` more times: submit a ridge job, kill -9 at a random moment once its
   worker has picked it up (loading, fitting, scoring, saving, registering), restart, and
   check the job is either ``succeeded`` with a complete, served stitch or ``failed`` /
   ``interrupted`` with no folder, that no temporary leftovers remain, and that every
   earlier job is intact.

Usage: ``.venv/bin/python scripts/kill9_check.py [--rounds 6] [--seed 0]``; prints a JSON
report and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Server, alive, dataset_file, scifact_pairs, wait_job

from lead.client import encode_base64

OCTET = {"content-type": "application/octet-stream"}


def folder_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


class Checks:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def __call__(self, name: str, ok: bool, detail: Any = None) -> bool:
        self.results.append(
            {"check": name, "ok": bool(ok), **({"detail": detail} if detail else {})}
        )
        return ok

    @property
    def passed(self) -> bool:
        return all(r["ok"] for r in self.results)


def leftovers(data_dir: Path) -> list[str]:
    return [
        str(p.relative_to(data_dir))
        for folder in ("stitches", "datasets", "job-data")
        for p in (data_dir / folder).iterdir()
        if p.name.startswith(".")
    ]


def check_intact(
    client: httpx.Client,
    data_dir: Path,
    done: dict[str, dict[str, Any]],
    digests: dict[str, str],
    x: Any,
    check: Checks,
    tag: str,
) -> None:
    """Every earlier succeeded job: same record, same stitch files, served."""
    for job_id, before in done.items():
        after = client.get(f"/v1/jobs/{job_id}").json()
        check(f"{tag}: job {job_id} unchanged", after == before)
        folder = data_dir / "stitches" / before["stitch_id"]
        check(
            f"{tag}: stitch {before['stitch_id']} files unchanged",
            folder.is_dir() and folder_digest(folder) == digests[job_id],
        )
        r = client.post("/v1/translate", json={"stitch": before["stitch_id"], "input": x})
        check(f"{tag}: stitch {before['stitch_id']} served", r.status_code == 200, r.status_code)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    pairs = scifact_pairs("minilm", "e5")
    models = {"source_model": pairs["source_model"], "target_model": pairs["target_model"]}
    x = encode_base64(pairs["source_queries"][:4])
    check = Checks()
    report: dict[str, Any] = {"rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        server = Server(data_dir).start()
        try:
            client = httpx.Client(base_url=server.url, timeout=60)
            r = client.post("/v1/datasets", content=dataset_file(pairs), headers=OCTET)
            ds = r.json()["id"]
            first = wait_job(
                client, client.post("/v1/jobs", json={**models, "dataset": ds}).json()["id"]
            )
            check("earlier ridge job succeeded", first["status"] == "succeeded", first["status"])
            done = {first["id"]: first}
            digests = {first["id"]: folder_digest(data_dir / "stitches" / first["stitch_id"])}
            slow = client.post(
                "/v1/jobs",
                json={
                    **models,
                    "dataset": ds,
                    "method": "mlp",
                    "stitch_id": "kill9-mlp",
                    "options": {"hidden_dim": 512, "max_epochs": 1000, "patience": 1000},
                },
            ).json()
            training = wait_job(
                client,
                slow["id"],
                until=lambda j: j["progress"]["stage"] == "train" and j["progress"]["step"] >= 1,
            )
            workers = server.children()
            client.close()
            server.kill9()
            time.sleep(3.0)
            orphans = [pid for pid in workers if alive(pid)]
            check(
                "training worker exited with the server",
                not orphans,
                {"workers": workers, "alive": orphans},
            )
            check(
                "no stitch folder of the killed job",
                not (data_dir / "stitches" / "kill9-mlp").exists(),
            )
            report["killed_while"] = training["progress"]

            server = Server(data_dir).start()
            client = httpx.Client(base_url=server.url, timeout=60)
            after = client.get(f"/v1/jobs/{slow['id']}").json()
            check(
                "killed job failed/interrupted",
                after["status"] == "failed" and after["error"]["code"] == "interrupted",
                {"status": after["status"], "error": after["error"]},
            )
            check_intact(client, data_dir, done, digests, x, check, "after kill -9")
            check("no leftovers after restart", not leftovers(data_dir), leftovers(data_dir))

            for i in range(args.rounds):
                delay = rng.uniform(0.0, 3.0)  # a ridge job on 5,183 pairs: ~1-3 s once started
                job = client.post("/v1/jobs", json={**models, "dataset": ds, "seed": i + 1}).json()
                wait_job(
                    client,
                    job["id"],
                    until=lambda j: (
                        j["progress"]["stage"] != "starting" and j["status"] != "queued"
                    ),
                )  # the new worker has imported torch
                time.sleep(delay)
                stage = client.get(f"/v1/jobs/{job['id']}").json()
                client.close()
                server.kill9()
                time.sleep(1.0)
                server = Server(data_dir).start()
                client = httpx.Client(base_url=server.url, timeout=60)
                after = client.get(f"/v1/jobs/{job['id']}").json()
                folder = data_dir / "stitches" / job["stitch_id"]
                outcome = {
                    "round": i + 1,
                    "kill_after_start_s": round(delay, 2),
                    "status_before": stage["status"],
                    "stage_before": stage["progress"]["stage"],
                    "status_after": after["status"],
                    "error_after": after["error"] and after["error"]["code"],
                }
                report["rounds"].append(outcome)
                if after["status"] == "succeeded":
                    served = client.post(
                        "/v1/translate", json={"stitch": job["stitch_id"], "input": x}
                    )
                    check(
                        f"round {i + 1}: succeeded job is complete and served",
                        folder.is_dir() and served.status_code == 200 and after["scorecard"],
                    )
                    done[job["id"]] = after
                    digests[job["id"]] = folder_digest(folder)
                elif after["status"] == "queued":  # killed before it was claimed: it runs now
                    after = wait_job(client, job["id"])
                    check(f"round {i + 1}: re-queued job ran", after["status"] == "succeeded")
                    done[job["id"]] = after
                    digests[job["id"]] = folder_digest(folder)
                else:
                    check(
                        f"round {i + 1}: failed/interrupted without a folder",
                        after["status"] == "failed"
                        and after["error"]["code"] == "interrupted"
                        and not folder.exists(),
                        outcome,
                    )
                check(f"round {i + 1}: no leftovers", not leftovers(data_dir), leftovers(data_dir))
                check_intact(client, data_dir, done, digests, x, check, f"round {i + 1}")
            client.close()
        finally:
            server.stop()
    report["checks"] = len(check.results)
    report["failed"] = [r for r in check.results if not r["ok"]]
    report["passed"] = check.passed
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0 if check.passed else 1


if __name__ == "__main__":
    sys.exit(main())

"""A stitch's files over HTTP (``GET /v1/stitch-files/{name}?stitch=ID``) and deleting stitches
trained by jobs (``DELETE /v1/stitches/{id}``): gone for good, across a restart, without
breaking translations in flight."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi.testclient import TestClient
from jobs_helpers import make_jobs_client, scifact_dataset, upload, wait_job
from service_helpers import b64

from lead.artifacts import ARTIFACT_FILES, load_stitch
from service.jobs.store import JobStore

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"
MEDIA_TYPES = {
    "model.safetensors": "application/octet-stream",
    "config.json": "application/json",
    "README.md": "text/markdown; charset=utf-8",
}


def _train(client: TestClient, dataset: str, stitch_id: str) -> dict[str, Any]:
    body = {"source_model": MINILM, "target_model": MPNET, "dataset": dataset}
    r = client.post("/v1/jobs", json={**body, "stitch_id": stitch_id})
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["id"])
    assert job["status"] == "succeeded", job
    return job


def _download(client: TestClient, stitch_id: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in ARTIFACT_FILES:
        r = client.get(f"/v1/stitch-files/{name}", params={"stitch": stitch_id})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == MEDIA_TYPES[name]
        assert r.headers["content-length"] == str(len(r.content))
        head = client.head(f"/v1/stitch-files/{name}", params={"stitch": stitch_id})
        assert head.status_code == 200, head.text
        assert head.content == b""
        for header in ("content-type", "content-length", "content-disposition"):
            assert head.headers[header] == r.headers[header], header
        (folder / name).write_bytes(r.content)
    return folder


def _same_stitch(a: Path, b: Path, x: np.ndarray) -> None:
    first, second = load_stitch(a), load_stitch(b)
    assert first.state_dict().keys() == second.state_dict().keys()
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, second.state_dict()[name]), name
    with torch.inference_mode():
        assert torch.equal(first(torch.from_numpy(x)), second(torch.from_numpy(x)))


def test_files_of_job_and_configured_stitches_download_and_load(
    tmp_path: Path, fitted: Any, scifact_small: Any
) -> None:
    data_dir = tmp_path / "data"
    client = make_jobs_client(data_dir, stitches=[str(fitted.folder("minilm-to-pml3"))])
    try:
        dataset = upload(client, scifact_dataset(scifact_small))["id"]
        _train(client, dataset, "trained-here")
        x = scifact_small.queries["minilm"][:5]
        for stitch_id, origin in (
            ("trained-here", data_dir / "stitches" / "trained-here"),
            ("minilm-to-pml3", fitted.folder("minilm-to-pml3")),
        ):
            got = _download(client, stitch_id, tmp_path / "downloads" / stitch_id)
            for name in ARTIFACT_FILES:  # the files as they are on the server, byte for byte
                assert (got / name).read_bytes() == (origin / name).read_bytes(), name
            _same_stitch(got, origin, x)
        config = client.get("/v1/stitch-files/config.json", params={"stitch": "trained-here"})
        assert json.loads(config.content)["source"]["model"] == MINILM
        card = client.get("/v1/stitch-files/README.md", params={"stitch": "trained-here"})
        assert card.text.startswith("---") and "library_name: lead" in card.text

        r = client.get("/v1/stitch-files/config.json", params={"stitch": "no-such-stitch"})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "stitch_not_found"
        r = client.head("/v1/stitch-files/config.json", params={"stitch": "no-such-stitch"})
        assert r.status_code == 404
        r = client.head("/v1/stitch-files/weights.pt", params={"stitch": "trained-here"})
        assert r.status_code == 422
        r = client.get("/v1/stitch-files/weights.pt", params={"stitch": "trained-here"})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "name"
        r = client.get("/v1/stitch-files/config.json")
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "stitch"
    finally:
        client.__exit__(None, None, None)


def test_deleted_job_stitch_stays_deleted_after_a_restart(
    tmp_path: Path, fitted: Any, scifact_small: Any
) -> None:
    data_dir = tmp_path / "data"
    x = b64(scifact_small.queries["minilm"][:3])
    first = make_jobs_client(data_dir, stitches=[str(fitted.folder("minilm-to-pml3"))])
    try:
        dataset = upload(first, scifact_dataset(scifact_small))["id"]
        job = _train(first, dataset, "bad-stitch")
        half_deleted = _train(first, dataset, "half-deleted")
        kept = _train(first, dataset, "kept")

        r = first.delete("/v1/stitches/minilm-to-pml3")  # configured: never deleted over HTTP
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "conflict"
        assert "LEAD_STITCHES" in r.json()["error"]["message"]
        assert first.get("/v1/stitches/minilm-to-pml3").status_code == 200
        r = first.delete("/v1/stitches/no-such-stitch")
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "stitch_not_found"

        r = first.delete("/v1/stitches/bad-stitch")
        assert r.status_code == 200, r.text
        assert r.json() == {
            "object": "stitch.deleted",
            "id": "bad-stitch",
            "deleted": True,
            "job": job["id"],
        }
        assert not (data_dir / "stitches" / "bad-stitch").exists()
        assert first.get("/v1/stitches/bad-stitch").status_code == 404
        r = first.post("/v1/translate", json={"stitch": "bad-stitch", "input": x})
        assert r.status_code == 404, r.text
        assert first.get("/v1/stitch-files/config.json?stitch=bad-stitch").status_code == 404
        again = first.delete("/v1/stitches/bad-stitch")
        assert again.status_code == 404, again.text
        assert "was deleted already" in again.json()["error"]["message"]
        assert job["id"] in again.json()["error"]["message"]
        record = first.get(f"/v1/jobs/{job['id']}").json()
        assert record["status"] == "succeeded"  # the job record stays, and says so
        assert record["result"]["stitch_id"] == "bad-stitch"
        assert isinstance(record["result"]["stitch_deleted_at"], int)
        assert record["result"]["served"] is False
        assert "deleted" in record["result"]["not_served_reason"]
        assert first.get(f"/v1/jobs/{kept['id']}").json()["result"]["stitch_deleted_at"] is None
        r = first.post(
            "/v1/jobs",
            json={"source_model": MINILM, "target_model": MPNET, "dataset": dataset,
                  "stitch_id": "bad-stitch"},
        )  # fmt: skip
        assert r.status_code == 409, r.text  # the id of a deleted stitch is not used again
        assert "deleted" in r.json()["error"]["message"]
    finally:
        first.__exit__(None, None, None)

    # a server that stopped after recording a deletion but before removing the folder
    store = JobStore(data_dir / "lead.sqlite3")
    store.mark_stitch_deleted("half-deleted")
    store.close()
    assert (data_dir / "stitches" / "half-deleted").is_dir()

    second = make_jobs_client(data_dir, stitches=[str(fitted.folder("minilm-to-pml3"))])
    try:
        served = [s["id"] for s in second.get("/v1/stitches").json()["data"]]
        assert served == ["kept", "minilm-to-pml3"]
        assert sorted(p.name for p in (data_dir / "stitches").iterdir()) == ["kept"]
        for deleted in (job, half_deleted):
            record = second.get(f"/v1/jobs/{deleted['id']}").json()
            assert record["status"] == "succeeded"
            assert record["result"]["stitch_deleted_at"] is not None
        r = second.post("/v1/translate", json={"stitch": "bad-stitch", "input": x})
        assert r.status_code == 404, r.text
        r = second.post("/v1/translate", json={"stitch": "kept", "input": x})
        assert r.status_code == 200, r.text
    finally:
        second.__exit__(None, None, None)


def test_translations_in_flight_survive_a_deletion(tmp_path: Path, scifact_small: Any) -> None:
    client = make_jobs_client(tmp_path / "data")
    try:
        dataset = upload(client, scifact_dataset(scifact_small))["id"]
        _train(client, dataset, "busy")
        body = {"stitch": "busy", "input": b64(scifact_small.queries["minilm"][:64])}
        statuses: list[int] = []
        started = threading.Barrier(3)
        deleted = threading.Event()

        def translate() -> None:
            started.wait()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                r = client.post("/v1/translate", json=body)
                statuses.append(r.status_code)
                if deleted.is_set() and r.status_code == 404:
                    return

        threads = [threading.Thread(target=translate) for _ in range(2)]
        for thread in threads:
            thread.start()
        started.wait()
        while 200 not in statuses:
            time.sleep(0.01)
        r = client.delete("/v1/stitches/busy")
        deleted.set()
        for thread in threads:
            thread.join(timeout=60)
        assert r.status_code == 200, r.text
        assert 200 in statuses and statuses[-1] == 404
        assert set(statuses) <= {200, 404}, statuses  # never a 500
        r = client.get("/v1/stitches")
        assert r.json()["data"] == []
    finally:
        client.__exit__(None, None, None)


def test_stitch_ids_with_slashes_and_at_signs_reach_their_files(
    tmp_path: Path, fitted: Any
) -> None:
    """The files route takes the id in the query, so ``org/name@rev`` ids cannot clash."""
    client = make_jobs_client(tmp_path / "data", stitches=[str(fitted.folder("minilm-to-mpnet"))])
    try:
        r = client.get("/v1/stitch-files/config.json", params={"stitch": "org/files@config.json"})
        assert r.status_code == 404, r.text
        assert "org/files@config.json" in r.json()["error"]["message"]
        r = client.get("/v1/stitches/minilm-to-mpnet/files/config.json")
        assert r.status_code == 404, r.text  # a stitch id, not a file route
    finally:
        client.__exit__(None, None, None)


def test_only_regular_files_of_the_stitch_folder_are_served(tmp_path: Path, fitted: Any) -> None:
    """A configured folder whose model card links out of it (to ``/etc/passwd``) served that
    file, and one that is a FIFO hung the request; both are 404s now, and a link inside the
    folder (as the Hugging Face cache makes them) is followed."""
    folder = tmp_path / "linked"
    shutil.copytree(fitted.folder("minilm-to-mpnet"), folder)
    secret = tmp_path / "secret.txt"
    secret.write_text("not the model card")
    (folder / "README.md").unlink()
    (folder / "README.md").symlink_to(secret)
    (folder / "card.md").write_text("the model card")
    (folder / "config.json").rename(folder / "real-config.json")
    (folder / "config.json").symlink_to("real-config.json")
    client = make_jobs_client(tmp_path / "data", stitches=[str(folder)])
    try:
        r = client.get("/v1/stitch-files/README.md", params={"stitch": "linked"})
        assert r.status_code == 404, r.text
        assert "not the model card" not in r.text
        r = client.get("/v1/stitch-files/config.json", params={"stitch": "linked"})
        assert r.status_code == 200, r.text
        assert r.content == (folder / "real-config.json").read_bytes()
        if hasattr(os, "mkfifo"):
            (folder / "README.md").unlink()
            os.mkfifo(folder / "README.md")
            r = client.get("/v1/stitch-files/README.md", params={"stitch": "linked"})
            assert r.status_code == 404, r.text
        assert client.get("/healthz").status_code == 200
    finally:
        client.__exit__(None, None, None)


def test_translation_only_replicas_serve_files_but_delete_nothing(
    tmp_path: Path, fitted: Any
) -> None:
    client = make_jobs_client(
        tmp_path / "data", stitches=[str(fitted.folder("minilm-to-mpnet"))], enable_jobs=False
    )
    try:
        r = client.delete("/v1/stitches/minilm-to-mpnet")
        assert r.status_code == 503, r.text
        assert "LEAD_ENABLE_JOBS" in r.json()["error"]["message"]
        r = client.get("/v1/stitch-files/model.safetensors?stitch=minilm-to-mpnet")
        assert r.status_code == 200  # files are served on translation-only replicas too
        assert r.content == (fitted.folder("minilm-to-mpnet") / "model.safetensors").read_bytes()
    finally:
        client.__exit__(None, None, None)

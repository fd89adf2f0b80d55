"""lead.client.LeadClient and the remote ``lead`` subcommands, against the real app (ASGI,
through Starlette's TestClient, which is an httpx.Client): upload, train, wait, translate,
align, cancel, and errors raised as LeadError subclasses."""

from __future__ import annotations

import argparse
import json
import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.numpy import save

from lead import _remote_cli
from lead.alignment import alignment_scores
from lead.artifacts import load_stitch
from lead.cli import main
from lead.client import LeadClient
from lead.errors import (
    AuthenticationError,
    ConflictError,
    DatasetNotFoundError,
    DecodeError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    JobNotFoundError,
    ModelMismatchError,
    NotFoundError,
    PermissionDeniedError,
    StitchNotFoundError,
    StoreError,
    TooFewPairsError,
)
from service.app import create_app
from service.settings import Settings

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("client-data")


@pytest.fixture(scope="module")
def http(data_dir: Path) -> Iterator[TestClient]:
    settings = Settings(stitches=[], data_dir=data_dir, device="cpu", load_in_background=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def lead(http: TestClient) -> LeadClient:
    return LeadClient(http=http)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory, scifact_small: Any) -> Path:
    path = tmp_path_factory.mktemp("files") / "pairs.safetensors"
    path.write_bytes(
        save({"source": scifact_small.corpus["minilm"], "target": scifact_small.corpus["mpnet"]})
    )
    return path


@pytest.fixture(scope="module")
def trained(lead: LeadClient, pairs_file: Path) -> dict[str, Any]:
    dataset = lead.upload_dataset(pairs_file, name="minilm-mpnet")
    job = lead.submit_job(MINILM, MPNET, dataset=dataset["id"], seed=1)
    seen: list[str] = []
    done = lead.wait_job(
        job["id"], poll_interval=0.05, on_update=lambda j: seen.append(j["status"])
    )
    return {"dataset": dataset, "job": done, "seen": seen}


def test_upload_train_wait_translate(
    lead: LeadClient, trained: dict[str, Any], data_dir: Path, scifact_small: Any
) -> None:
    assert trained["dataset"]["pairs"] == 400 and trained["dataset"]["name"] == "minilm-mpnet"
    job = trained["job"]
    assert job["status"] == "succeeded", job
    assert trained["seen"][-1] == "succeeded" and set(trained["seen"]) <= {
        "queued",
        "running",
        "succeeded",
    }
    x = scifact_small.queries["minilm"][:6]
    y = lead.translate(x, stitch=job["result"]["stitch_id"])
    stitch = load_stitch(data_dir / "stitches" / job["result"]["stitch_id"])
    with torch.inference_mode():
        expected = stitch(torch.from_numpy(x)).numpy()
    assert y.dtype == np.float32 and y.shape == (6, 768)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    by_models = lead.translate(x, source_model=MINILM, target_model=MPNET)
    np.testing.assert_array_equal(by_models, y)
    listed = lead.list_jobs(limit=5)
    assert listed["data"][0]["id"] == job["id"]
    assert lead.get_dataset(trained["dataset"]["id"]) == trained["dataset"]


def test_align_inline_and_by_dataset(lead: LeadClient, scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"][:40], scifact_small.corpus["pml3"][:40]
    got = lead.align(source=X, target=Y, folds=2)
    assert got.pop("object") == "alignment"
    expected = alignment_scores(X, Y, folds=2)
    # 40 pairs of 384-dimensional vectors are too few for PWCCA: null on both paths
    assert got.pop("pwcca_score") is None and expected.pop("pwcca_score") is None
    baseline, expected_baseline = got.pop("shuffled_baseline"), expected.pop("shuffled_baseline")
    assert got == pytest.approx(expected)
    assert baseline.keys() == expected_baseline.keys()
    assert baseline["unbiased_cka_score"] == pytest.approx(expected_baseline["unbiased_cka_score"])
    dataset = lead.upload_pairs(X, Y)
    by_id = lead.align(dataset=dataset["id"], folds=2)
    assert by_id["linear_cka_score"] == pytest.approx(got["linear_cka_score"])


def test_errors_are_lead_errors(
    lead: LeadClient, trained: dict[str, Any], scifact_small: Any
) -> None:
    with pytest.raises(JobNotFoundError) as missing:
        lead.get_job("job_missing")
    assert missing.value.status_code == 404  # type: ignore[attr-defined]
    assert missing.value.request_id  # type: ignore[attr-defined]
    with pytest.raises(DatasetNotFoundError):
        lead.submit_job(MINILM, MPNET, dataset="ds_missing")
    with pytest.raises(ConflictError):
        lead.cancel_job(trained["job"]["id"])
    with pytest.raises(DecodeError):
        lead.upload_dataset(b"not safetensors")
    X = scifact_small.corpus["minilm"][:5]
    with pytest.raises(TooFewPairsError):
        lead.submit_job(MINILM, MPNET, source=X, target=scifact_small.corpus["mpnet"][:5])
    body = {"dataset": trained["dataset"]["id"], "idempotency_key": "client-key"}
    first = lead.submit_job(MINILM, MPNET, stitch_id="from-the-client", **body)
    assert lead.submit_job(MINILM, MPNET, stitch_id="from-the-client", **body)["id"] == first["id"]
    with pytest.raises(IdempotencyKeyReusedError):
        lead.submit_job(MINILM, MPNET, stitch_id="other-id", **body)
    assert lead.wait_job(first["id"], poll_interval=0.05)["status"] == "succeeded"


def test_ids_cannot_walk_to_another_route(lead: LeadClient, trained: dict[str, Any]) -> None:
    """``delete_dataset("../stitches/ID")`` deleted stitch ID: the URL's dot segment was
    resolved. Every id is one path part now, dots included."""
    stitch_id = trained["job"]["result"]["stitch_id"]
    with pytest.raises(NotFoundError):
        lead.delete_dataset(f"../stitches/{stitch_id}")
    with pytest.raises(NotFoundError):
        lead.get_dataset("..")
    with pytest.raises(NotFoundError):
        lead.get_job("../stitches")
    with pytest.raises(NotFoundError):
        lead.cancel_job(f"../../v1/jobs/{trained['job']['id']}")
    with pytest.raises(NotFoundError):
        lead.get_stitch(f"../jobs/{trained['job']['id']}")
    assert lead.get_stitch(stitch_id)["id"] == stitch_id  # still served
    for empty in ("", "/"):  # the collection's URL answered a redirect, not JSON
        with pytest.raises(InvalidInputError, match="an id cannot be empty"):
            lead.get_dataset(empty)
        with pytest.raises(InvalidInputError, match="an id cannot be empty"):
            lead.get_job(empty)


def test_wait_timeout_then_cancel(lead: LeadClient, trained: dict[str, Any]) -> None:
    options = {"hidden_dim": 16, "batch_size": 64, "max_epochs": 100000, "patience": 100000}
    job = lead.submit_job(
        MINILM, MPNET, dataset=trained["dataset"]["id"], method="mlp", options=options
    )
    with pytest.raises(TimeoutError):
        lead.wait_job(job["id"], poll_interval=0.05, timeout=0.2)
    assert lead.cancel_job(job["id"])["status"] in ("cancelled", "cancelling")
    assert lead.wait_job(job["id"], poll_interval=0.05)["status"] == "cancelled"


def test_server_url_and_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAD_SERVER_URL", "http://lead.example:9000")
    monkeypatch.setenv("LEAD_API_KEY", "secret")
    with LeadClient() as client:
        assert str(client.http.base_url) == "http://lead.example:9000"
        assert client._headers == {"Authorization": "Bearer secret"}


def test_api_keys_are_sent(tmp_path: Path) -> None:
    settings = Settings(
        stitches=[], data_dir=tmp_path, device="cpu", api_keys=["k1", "reader:translate"]
    )
    with TestClient(create_app(settings)) as http:
        assert LeadClient(http=http, api_key="k1").list_datasets()["data"] == []
        with pytest.raises(AuthenticationError):
            LeadClient(http=http, api_key="wrong").list_datasets()
        reader = LeadClient(http=http, api_key="reader")
        assert reader.list_stitches()["data"] == []
        with pytest.raises(PermissionDeniedError) as refused:
            reader.list_datasets()
        assert refused.value.status_code == 403  # type: ignore[attr-defined]
        assert refused.value.code == "insufficient_scope"  # type: ignore[attr-defined]
        with pytest.raises(PermissionDeniedError):
            reader.delete_stitch("anything")


def test_cli_without_a_key_says_where_the_key_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(stitches=[], data_dir=tmp_path, device="cpu", api_keys=["k1"])
    monkeypatch.delenv("LEAD_API_KEY", raising=False)
    with TestClient(create_app(settings)) as http:
        monkeypatch.setattr(
            _remote_cli, "connect", lambda args: LeadClient(http=http, api_key=args.api_key)
        )
        assert main(["jobs", "list"]) == 2
        err = capsys.readouterr().err
        assert "missing API key" in err and "--api-key or LEAD_API_KEY" in err
        assert main(["jobs", "list", "--api-key", "k1"]) == 0
        capsys.readouterr()
        assert main(["jobs", "list", "--api-key", "wrong"]) == 2  # a key was given: no hint
        err = capsys.readouterr().err
        assert "invalid API key" in err and "LEAD_API_KEY" not in err


def test_download_and_delete_a_stitch(
    lead: LeadClient, trained: dict[str, Any], tmp_path: Path, scifact_small: Any
) -> None:
    job = lead.submit_job(MINILM, MPNET, dataset=trained["dataset"]["id"], stitch_id="to-drop")
    assert lead.wait_job(job["id"], poll_interval=0.05)["status"] == "succeeded"
    assert lead.get_stitch("to-drop")["origin"] == "job"
    folder = lead.download_stitch("to-drop", tmp_path / "nested" / "to-drop")
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no leftovers
    x = torch.from_numpy(scifact_small.queries["minilm"][:4])
    with torch.inference_mode():
        expected = lead.translate(x.numpy(), stitch="to-drop")
        np.testing.assert_allclose(load_stitch(folder)(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidInputError, match="force"):
        lead.download_stitch("to-drop", folder)  # not an empty folder
    (folder / "config.json").write_text('{"format": "lead-stitch"}')  # an old copy
    assert lead.download_stitch("to-drop", folder, force=True) == folder
    assert load_stitch(folder).info.target_model == MPNET
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no leftovers
    (folder.parent / "mine").mkdir()
    (folder.parent / "mine" / "notes.txt").write_text("a user's file")
    with pytest.raises(InvalidInputError, match="not an empty folder or a stitch folder"):
        lead.download_stitch("to-drop", folder.parent / "mine", force=True)
    assert (folder.parent / "mine" / "notes.txt").read_text() == "a user's file"
    with pytest.raises(StitchNotFoundError):
        lead.download_stitch("no-such-stitch", tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    deleted = lead.delete_stitch("to-drop")
    assert deleted == {"object": "stitch.deleted", "id": "to-drop", "deleted": True,
                       "job": job["id"]}  # fmt: skip
    with pytest.raises(StitchNotFoundError):
        lead.get_stitch("to-drop")
    assert lead.get_job(job["id"])["result"]["stitch_deleted_at"] is not None
    assert load_stitch(folder).d_src == 384  # the downloaded copy stays usable


# ----------------------------------------------------------------------------- the CLI


@pytest.fixture
def cli(
    http: TestClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Any:
    """``cli(*argv) -> (status, stdout JSON or None, stderr)`` with the app as the server."""
    monkeypatch.setattr(_remote_cli, "connect", lambda args: LeadClient(http=http))

    def run(*argv: str) -> tuple[int, Any, str]:
        status = main(list(argv))
        out, err = capsys.readouterr()
        return status, json.loads(out) if out.strip() else None, err

    return run


def test_cli_datasets_jobs_align(cli: Any, pairs_file: Path) -> None:
    status, dataset, _ = cli("datasets", "upload", str(pairs_file), "--name", "cli")
    assert status == 0 and dataset["name"] == "cli"
    status, job, err = cli(
        "jobs", "submit", "--dataset", dataset["id"], "--source-model", MINILM,
        "--target-model", MPNET, "--option", "alpha=0.01", "--seed", "2", "--wait",
        "--interval", "0.05",
    )  # fmt: skip
    assert status == 0, err
    assert job["status"] == "succeeded" and job["options"] == {"alpha": 0.01}
    assert job["seed"] == 2
    status, listed, _ = cli("jobs", "list", "--limit", "1")
    assert status == 0 and listed["data"][0]["id"] == job["id"]
    status, again, _ = cli("jobs", "get", job["id"])
    assert status == 0 and again == job
    status, waited, err = cli("jobs", "wait", job["id"], "--interval", "0.05")
    assert status == 0 and waited["status"] == "succeeded"
    # a job seen first when done: its bar opens at 1/1, with no rate from the polls
    assert "100%" in err and "1/1" in err and " 0%" not in err and "it/s" not in err, err
    status, _, err = cli("jobs", "cancel", job["id"])
    assert status == 2 and "already finished" in err
    status, scores, _ = cli("align", "--dataset", dataset["id"], "--folds", "2")
    assert status == 0 and scores["pairs"] == 400
    for key in ("unbiased_cka_score", "cknna_score", "cycle_knn_score", "svcca_score"):
        assert 0 < scores[key] < 1, key
    assert scores["pwcca_score"] is None  # 384 + 768 directions need more than 400 pairs
    status, deleted, _ = cli("datasets", "delete", dataset["id"])
    assert status == 0 and deleted["deleted"] is True


def test_cli_stitches_download_and_delete(
    cli: Any, lead: LeadClient, trained: dict[str, Any], tmp_path: Path
) -> None:
    job = lead.submit_job(MINILM, MPNET, dataset=trained["dataset"]["id"], stitch_id="cli-drop")
    assert lead.wait_job(job["id"], poll_interval=0.05)["status"] == "succeeded"
    status, listed, _ = cli("stitches", "list")
    assert status == 0 and "cli-drop" in [s["id"] for s in listed["data"]]
    status, shown, _ = cli("stitches", "get", "cli-drop")
    assert status == 0 and shown["source"]["dim"] == 384
    out = tmp_path / "cli-drop"
    status, result, err = cli("stitches", "download", "cli-drop", "--out", str(out))
    assert status == 0, err
    assert result == {"id": "cli-drop", "folder": str(out)}
    assert load_stitch(out).info.target_model == MPNET
    status, _, err = cli("stitches", "download", "cli-drop", "--out", str(out))
    assert status == 2 and "not an empty folder" in err and "--force" in err
    status, _, err = cli("stitches", "download", "cli-drop", "--out", str(out), "--force")
    assert status == 0, err
    status, deleted, _ = cli("stitches", "delete", "cli-drop")
    assert status == 0 and deleted["deleted"] is True
    status, _, err = cli("stitches", "get", "cli-drop")
    assert status == 2 and "no stitch 'cli-drop'" in err


def test_cli_submit_from_files_and_local_align(cli: Any, pairs_file: Path) -> None:
    status, job, err = cli(
        "jobs", "submit", "--source", f"{pairs_file}:source", "--target", f"{pairs_file}:target",
        "--source-model", MINILM, "--target-model", "mpnet-copy", "--method", "procrustes",
    )  # fmt: skip
    assert status == 0, err
    assert job["status"] == "queued" and job["pairs"] == 400 and job["dataset"]
    status, local, err = cli(
        "align", "--source", f"{pairs_file}:source", "--target", f"{pairs_file}:target",
        "--folds", "2", "--max-pairs", "60",
    )  # fmt: skip
    assert status == 0 and local["pairs"] == 60
    names = ["unbiased_cka_score", "cknna_score", "cycle_knn_score", "svcca_score", "pwcca_score"]
    assert set(names) <= set(local)
    assert "warning" not in err
    # rows of the two files in different orders (mpnet's in ../shared/data): said, not silent
    from safetensors.numpy import load_file, save_file

    tensors = load_file(pairs_file)
    order = np.random.default_rng(0).permutation(len(tensors["target"]))
    shuffled = pairs_file.with_name("shuffled-pairs.safetensors")
    save_file({"source": tensors["source"], "target": tensors["target"][order]}, shuffled)
    status, scores, err = cli(
        "align", "--source", f"{shuffled}:source", "--target", f"{shuffled}:target",
        "--folds", "2",
    )  # fmt: skip
    assert status == 0 and scores["ridge_r2_score"] < 0.01
    assert "warning: the cross-validated ridge_r2_score" in err and "row i of --source" in err


def test_a_refused_submission_leaves_no_uploaded_dataset(
    cli: Any, lead: LeadClient, pairs_file: Path
) -> None:
    """Each refused `jobs submit --source/--target` left its upload on the server (a new
    user's retries with a misspelt method made a dataset each)."""
    before = len(lead.list_datasets(limit=100)["data"])
    status, _, err = cli(
        "jobs", "submit", "--source", f"{pairs_file}:source", "--target", f"{pairs_file}:target",
        "--source-model", MINILM, "--target-model", MPNET, "--method", "ridgee",
    )  # fmt: skip
    assert status == 2 and "unknown method 'ridgee'" in err
    assert len(lead.list_datasets(limit=100)["data"]) == before
    # its help said [0, 1), as lead fit's: the service refused 0 after the upload
    status, _, err = cli(
        "jobs", "submit", "--source", f"{pairs_file}:source", "--target", f"{pairs_file}:target",
        "--source-model", MINILM, "--target-model", MPNET, "--holdout", "0",
    )  # fmt: skip
    assert status == 2 and "--holdout" in err and "in (0, 1)" in err
    assert len(lead.list_datasets(limit=100)["data"]) == before


def test_cli_submit_allow_below_baseline(cli: Any, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from tests.conftest import FIXTURES

    everyday = load_file(FIXTURES / "everyday_sentences.safetensors")
    order = np.random.default_rng(0).permutation(len(everyday["mpnet"]))
    path = tmp_path / "shuffled.safetensors"  # pairs that cannot be learnt: R² below 0
    path.write_bytes(save({"source": everyday["minilm"], "target": everyday["mpnet"][order]}))
    submit = (
        "jobs", "submit", "--source", f"{path}:source", "--target", f"{path}:target",
        "--source-model", MINILM, "--target-model", MPNET, "--wait", "--interval", "0.05",
    )  # fmt: skip
    status, job, err = cli(*submit)
    assert status == 0, err
    assert job["status"] == "succeeded" and job["allow_below_baseline"] is False
    assert job["result"]["served"] is False
    assert f"warning: stitch {job['stitch_id']} is not served: held-out r2_score" in err
    status, job, err = cli(*submit, "--allow-below-baseline")
    assert status == 0, err
    assert job["allow_below_baseline"] is True and job["result"]["served"] is True
    assert "not served" not in err


def test_cli_submit_from_files_records_both_models_on_the_dataset(
    cli: Any, lead: LeadClient, pairs_file: Path
) -> None:
    status, job, err = cli(
        "jobs", "submit", "--source", f"{pairs_file}:source", "--target", f"{pairs_file}:target",
        "--source-model", MINILM, "--target-model", "mpnet-records", "--method", "procrustes",
    )  # fmt: skip
    assert status == 0, err
    dataset = lead.get_dataset(job["dataset"])
    assert (dataset["source_model"], dataset["target_model"]) == (MINILM, "mpnet-records")
    assert dataset["name"] == f"{MINILM} -> mpnet-records"
    with pytest.raises(ModelMismatchError, match="recorded with 'mpnet-records'"):
        lead.submit_job(MINILM, MPNET, dataset=job["dataset"])  # the models must match


def _closed_port() -> int:
    """A local TCP port with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_without_a_server_names_the_url_and_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"  # a real connection attempt, refused
    monkeypatch.delenv("LEAD_SERVER_URL", raising=False)
    assert main(["jobs", "list", "--server", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach the LEAD server at {url} (--server)")
    monkeypatch.setenv("LEAD_SERVER_URL", url)
    assert main(["jobs", "list"]) == 2
    assert f"at {url} (LEAD_SERVER_URL)" in capsys.readouterr().err


def test_an_unreachable_server_is_a_lead_error_naming_its_url() -> None:
    """httpx's own error said ``[Errno 111] Connection refused``, without the URL."""
    url = f"http://127.0.0.1:{_closed_port()}"
    with LeadClient(url) as client, pytest.raises(StoreError) as caught:
        client.list_jobs()
    assert f"cannot reach the LEAD server at {url}" in str(caught.value)
    assert caught.value.param == "server"
    x = np.zeros((2, 384), dtype=np.float32)
    with LeadClient(url) as client, pytest.raises(StoreError, match="cannot reach"):
        client.translate(x, stitch="any", format="arrow", retries=0)


def test_cli_unreachable_server(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def connect(args: argparse.Namespace) -> LeadClient:
        return LeadClient(http=httpx.Client(transport=httpx.MockTransport(refuse)))

    monkeypatch.setattr(_remote_cli, "connect", connect)
    assert main(["jobs", "list", "--server", "http://127.0.0.1:1"]) == 2
    assert "cannot reach the LEAD server at http://127.0.0.1:1" in capsys.readouterr().err


def test_cli_unreachable_server_names_the_url_it_tried(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def connect(args: argparse.Namespace) -> LeadClient:
        return LeadClient(http=httpx.Client(transport=httpx.MockTransport(refuse)))

    monkeypatch.setattr(_remote_cli, "connect", connect)
    monkeypatch.delenv("LEAD_SERVER_URL", raising=False)
    assert main(["jobs", "list"]) == 2
    err = capsys.readouterr().err
    assert "http://127.0.0.1:8000 (the default: set --server or LEAD_SERVER_URL)" in err
    monkeypatch.setenv("LEAD_SERVER_URL", "http://127.0.0.1:2")
    assert main(["jobs", "list"]) == 2
    assert "http://127.0.0.1:2 (LEAD_SERVER_URL)" in capsys.readouterr().err


def test_bad_arguments_are_lead_errors_before_anything_is_sent(
    lead: LeadClient, trained: dict[str, Any], scifact_small: Any, tmp_path: Path
) -> None:
    """Each raised a raw ValueError, TypeError, AttributeError, OSError, httpx.InvalidURL or
    UnicodeEncodeError (an adversarial pass); ``upload_dataset(0)`` read stdin."""
    X, Y = scifact_small.corpus["minilm"][:8], scifact_small.corpus["pml3"][:8]
    dataset = trained["dataset"]["id"]
    jobs_before = lead.list_jobs(limit=100)["data"]
    calls: list[tuple[Any, type[Exception], str]] = [
        (lambda: lead.align(source=X, target=Y, folds=math.nan), InvalidInputError,
         "folds: NaN and infinities cannot be sent"),
        (lambda: lead.align(source=X, target=Y, seed=object()), InvalidInputError,
         "seed: cannot be sent as JSON"),
        (lambda: lead.submit_job(MINILM, MPNET, dataset=dataset, holdout_fraction=math.inf),
         InvalidInputError, "holdout_fraction: NaN and infinities"),
        (lambda: lead.submit_job(MINILM, MPNET, dataset=dataset, options={"alpha": math.nan}),
         InvalidInputError, "options: NaN and infinities"),
        (lambda: lead.submit_job(MINILM, MPNET, dataset=dataset, idempotency_key="é"),
         InvalidInputError, "Idempotency-Key must be 1 to 255 printable ASCII"),
        (lambda: lead.submit_job(MINILM, MPNET, dataset=dataset, idempotency_key="a\nb"),
         InvalidInputError, "Idempotency-Key must be"),
        (lambda: lead.upload_dataset(tmp_path / "missing.safetensors"), InvalidInputError,
         "cannot read .*missing.safetensors: No such file"),
        (lambda: lead.upload_dataset(tmp_path), InvalidInputError, "cannot read"),
        (lambda: lead.upload_dataset(0), InvalidInputError, "file must be a path or bytes"),
        (lambda: lead.upload_dataset(None), InvalidInputError, "file must be a path or bytes"),
        (lambda: lead.upload_pairs([["a"]], [["b"]]), InvalidInputError, "source: vectors"),
        (lambda: lead.upload_pairs(X, Y, source_model=5), InvalidInputError,
         "source_model must be a string"),
        (lambda: lead.upload_pairs(X.astype(complex), Y), InvalidInputError,
         "complex128 values are not real numbers"),
        (lambda: lead.get_dataset(None), InvalidInputError, "an id must be a string"),
        (lambda: lead.get_job(5), InvalidInputError, "an id must be a string"),
        (lambda: lead.wait_job(trained["job"]["id"], poll_interval=-1), InvalidInputError,
         "poll_interval must be"),
        (lambda: lead.wait_job(trained["job"]["id"], timeout=math.nan), InvalidInputError,
         "timeout must be"),
        (lambda: lead.wait_job(trained["job"]["id"], on_update=5), InvalidInputError,
         "on_update must be callable"),
        (lambda: lead.download_stitch("x", None), InvalidInputError, "folder must be a path"),
        (lambda: LeadClient(8179), InvalidInputError, "server URL must be a string"),
        (lambda: LeadClient("http://[::1"), InvalidInputError, "the server URL 'http://\\[::1'"),
        (lambda: LeadClient("http://127.0.0.1:99999"), InvalidInputError,
         "port 99999 is not in 1-65535"),
        (lambda: LeadClient("http://127.0.0.1:8000?x=1"), InvalidInputError,
         "a query or fragment"),
        (lambda: LeadClient("http://"), InvalidInputError, "it has no host"),
        (lambda: LeadClient("ftp://host"), InvalidInputError, "http:// or https://"),
        (lambda: LeadClient("http://h", api_key=5), InvalidInputError, "API key must be a str"),
        # the models were dropped without a word, and a missing target read as bad vectors
        (lambda: lead.translate(X, stitch="minilm-to-pml3", source_model=MINILM),
         InvalidInputError, "either stitch or source_model"),
        (lambda: lead.translate_with_confidence(X, stitch="x", target_model=MPNET),
         InvalidInputError, "either stitch or source_model"),
        (lambda: lead.align(source=X), InvalidInputError, "target is missing"),
    ]  # fmt: skip
    for call, error, message in calls:
        with pytest.raises(error, match=message):
            call()
    assert lead.list_jobs(limit=100)["data"] == jobs_before  # nothing was submitted
    assert lead.get_job(trained["job"]["id"])["status"] == "succeeded"  # the next call works


def test_cli_refuses_bad_durations_and_both_data_sources(
    cli: Any, pairs_file: Path, trained: dict[str, Any]
) -> None:
    dataset = trained["dataset"]["id"]
    submit = ["jobs", "submit", "--dataset", dataset, "--source-model", MINILM,
              "--target-model", MPNET]  # fmt: skip
    job = trained["job"]["id"]
    for argv, message in [
        ([*submit, "--holdout", "nan"], "--holdout: must be in (0, 1), got 'nan'"),
        ([*submit, "--holdout", "1"], "--holdout: must be in (0, 1)"),
        ([*submit, "--wait", "--interval", "-1"], "--interval: must be a finite number >= 0"),
        (["jobs", "wait", job, "--interval", "nan"], "--interval: must be a finite number"),
        (["jobs", "wait", job, "--timeout", "-1"], "--timeout: must be a finite number >= 0"),
    ]:
        status, _, err = cli(*argv)
        assert status == 2 and message in err, err
    status, _, err = cli(*submit, "--source", str(pairs_file), "--target", str(pairs_file))
    assert status == 2 and "give --dataset, or --source and --target files, not both" in err
    status, _, err = cli(*submit, "--idempotency-key", "é")
    assert status == 2 and err.startswith("error: the Idempotency-Key must be"), err
    assert "Traceback" not in err

"""Embedding files: specs, lazy row-range reads, validation, streaming writers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import lead.data
from lead.data import (
    EmbeddingReader,
    EmbeddingWriter,
    check_embeddings,
    parse_spec,
    read_embeddings,
)
from lead.errors import (
    DecodeError,
    IllConditionedError,
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
)


@pytest.fixture
def arrays(tmp_path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    data = {
        "corpus": rng.normal(size=(50, 6)).astype(np.float32),
        "queries": rng.normal(size=(9, 6)).astype(np.float32),
    }
    save_file(data, tmp_path / "two.safetensors")
    save_file({"only": data["corpus"]}, tmp_path / "one.safetensors")
    np.save(tmp_path / "corpus.npy", data["corpus"])
    return data


def test_parse_spec(tmp_path: Path) -> None:
    assert parse_spec("a/b.safetensors:corpus") == (Path("a/b.safetensors"), "corpus")
    assert parse_spec("a/b.safetensors") == (Path("a/b.safetensors"), None)
    assert parse_spec("x.npy") == (Path("x.npy"), None)
    assert parse_spec("dir:with:colons/x.npy") == (Path("dir:with:colons/x.npy"), None)
    odd = tmp_path / "odd.safetensors:name"
    odd.write_bytes(b"")
    assert parse_spec(str(odd)) == (odd, None)  # an existing file wins


def test_read_safetensors_by_name_and_single_tensor(tmp_path: Path, arrays: dict) -> None:
    np.testing.assert_array_equal(
        read_embeddings(f"{tmp_path}/two.safetensors:queries"), arrays["queries"]
    )
    reader = EmbeddingReader(tmp_path / "one.safetensors")
    assert reader.tensor == "only" and reader.shape == (50, 6) and len(reader) == 50
    np.testing.assert_array_equal(reader.read(10, 20), arrays["corpus"][10:20])


def test_read_npy_lazily_by_row_range(tmp_path: Path, arrays: dict) -> None:
    reader = EmbeddingReader(tmp_path / "corpus.npy")
    rows = reader.read(45, 100)
    assert rows.dtype == np.float32 and rows.flags.writeable
    np.testing.assert_array_equal(rows, arrays["corpus"][45:])
    batches = list(reader.iter_batches(16))
    assert [start for start, _ in batches] == [0, 16, 32, 48]
    np.testing.assert_array_equal(np.concatenate([b for _, b in batches]), arrays["corpus"])
    picked = read_embeddings(tmp_path / "corpus.npy", rows=np.array([3, 1]))
    np.testing.assert_array_equal(picked, arrays["corpus"][[3, 1]])


def test_half_precision_is_read_as_float32(tmp_path: Path) -> None:
    from safetensors.torch import save_file as save_torch

    t = torch.randn(4, 3)
    save_torch({"x": t.to(torch.bfloat16)}, tmp_path / "bf16.safetensors")
    rows = read_embeddings(tmp_path / "bf16.safetensors")
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows, t.to(torch.bfloat16).float().numpy())


def test_non_finite_rows_are_named(tmp_path: Path) -> None:
    a = np.zeros((30, 4), np.float32)
    a[17, 2] = np.inf
    np.save(tmp_path / "bad.npy", a)
    reader = EmbeddingReader(tmp_path / "bad.npy")
    reader.read(0, 17)  # the rows before are fine
    with pytest.raises(NonFiniteError, match="row 17"):
        list(reader.iter_batches(8))


@pytest.mark.parametrize("suffix", ["npy", "safetensors"])
def test_float64_values_beyond_float32_are_named_not_cast_to_infinity(
    tmp_path: Path, suffix: str
) -> None:
    a = np.zeros((30, 4))
    a[17, 2] = -1e200
    path = tmp_path / f"big.{suffix}"
    np.save(path, a) if suffix == "npy" else save_file({"x": a}, path)
    reader = EmbeddingReader(path)
    reader.read(0, 17)
    with pytest.raises(NonFiniteError, match=r"-1e\+200 in row 17, column 2: beyond the float32"):
        list(reader.iter_batches(8))


def test_check_embeddings_checks_like_fitting() -> None:
    good = np.random.default_rng(0).normal(size=(20, 5)).astype(np.float32)
    check_embeddings(good, name="source")
    check_embeddings(torch.from_numpy(good), name="source")
    nan = good.copy()
    nan[6, 1] = np.nan
    with pytest.raises(NonFiniteError, match="source holds NaN or infinity in row 6"):
        check_embeddings(nan, name="source")
    big = good.astype(np.float64)
    big[2, 3] = 1e200
    with pytest.raises(NonFiniteError, match="row 2, column 3"):
        check_embeddings(big, name="source")
    wide = good * np.logspace(-10, 10, 5, dtype=np.float32)
    wide.setflags(write=False)  # read-only arrays are checked without a warning
    with pytest.raises(IllConditionedError) as info:
        check_embeddings(wide, name="target")
    assert info.value.param == "target" and "standardise" in info.value.message


def test_doctests() -> None:
    import doctest

    assert doctest.testmod(lead.data).failed == 0


def test_every_real_embedding_passes_check_embeddings(shared_data: Path) -> None:
    files = sorted(shared_data.glob("*/embeddings/*.safetensors"))
    assert files
    for path in files:
        for name, array in load_file(path).items():
            check_embeddings(array, name=f"{path.parent.parent.name}/{path.name}:{name}")


def test_reader_errors(tmp_path: Path, arrays: dict) -> None:
    with pytest.raises(InvalidInputError, match="no such file"):
        EmbeddingReader(tmp_path / "missing.npy")
    with pytest.raises(InvalidInputError, match="/dev/null is not a regular file"):
        EmbeddingReader("/dev/null")  # it was "no such file"
    (tmp_path / "junk.npy").write_bytes(b"hello")  # np.load takes it for a pickle
    with pytest.raises(DecodeError, match=r"does not start with the \.npy magic") as junk:
        EmbeddingReader(tmp_path / "junk.npy")
    assert "allow_pickle" not in str(junk.value)
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError, match="Python objects \\(pickled\\), which LEAD never"):
        EmbeddingReader(tmp_path / "objects.npy")
    with pytest.raises(InvalidInputError, match="name one"):
        EmbeddingReader(tmp_path / "two.safetensors")
    with pytest.raises(InvalidInputError, match="no tensor 'docs'"):
        EmbeddingReader(f"{tmp_path}/two.safetensors:docs")
    (tmp_path / "x.csv").write_text("1,2")
    with pytest.raises(InvalidInputError, match=r"\.safetensors or \.npy"):
        EmbeddingReader(tmp_path / "x.csv")
    np.save(tmp_path / "vec.npy", np.zeros(5))
    with pytest.raises(ShapeMismatchError):
        EmbeddingReader(tmp_path / "vec.npy")
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError):
        EmbeddingReader(tmp_path / "obj.npy")
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(DecodeError):
        EmbeddingReader(tmp_path / "junk.safetensors")
    with pytest.raises(InvalidInputError):
        list(EmbeddingReader(tmp_path / "corpus.npy").iter_batches(0))


@pytest.mark.parametrize("name", ["out.npy", "out.safetensors", "out.safetensors:vectors"])
def test_writer_streams_batches_to_a_loadable_file(tmp_path: Path, name: str) -> None:
    data = np.random.default_rng(1).normal(size=(23, 5)).astype(np.float32)
    spec = f"{tmp_path}/{name}"
    with EmbeddingWriter(spec, 23, 5, metadata={"stitch": "toy"}) as writer:
        for start in range(0, 23, 10):
            writer.write(data[start : start + 10].astype(np.float64))
    path, tensor = parse_spec(spec)
    if path.suffix == ".npy":
        np.testing.assert_array_equal(np.load(path), data)
    else:
        np.testing.assert_array_equal(load_file(path)[tensor or "embeddings"], data)
        with safe_open(str(path), "np") as f:
            assert f.metadata() == {"stitch": "toy"}
    np.testing.assert_array_equal(read_embeddings(spec if tensor else path), data)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_writer_leaves_no_file_when_incomplete_or_failing(tmp_path: Path) -> None:
    with (
        pytest.raises(ShapeMismatchError, match="wrote 2 rows, expected 3"),
        EmbeddingWriter(tmp_path / "a.npy", 3, 2) as writer,
    ):
        writer.write(np.zeros((2, 2)))
    with (
        pytest.raises(RuntimeError, match="boom"),
        EmbeddingWriter(tmp_path / "b.safetensors", 3, 2) as writer,
    ):
        writer.write(np.zeros((1, 2)))
        raise RuntimeError("boom")
    with pytest.raises(ShapeMismatchError), EmbeddingWriter(tmp_path / "c.npy", 3, 2) as writer:
        writer.write(np.zeros((1, 3)))
    with pytest.raises(InvalidInputError):
        EmbeddingWriter(tmp_path / "d.txt", 3, 2)
    assert list(tmp_path.iterdir()) == []

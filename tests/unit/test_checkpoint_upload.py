"""`checkpoint.upload`: one pass that checksums a snapshot's stream and copies it into new tensors.

Run with CPU destinations (the CUDA path differs only in pinned bounce buffers and streams)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from resctl.checkpoint import format as fmt
from resctl.checkpoint import memory, upload

DTYPES = [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bfloat16]


def _stream(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[fmt.TensorSpec]]:
    specs, total = fmt.plan_stream(tensors)
    stream = torch.randint(0, 256, (total,), dtype=torch.uint8)  # padding holds noise: it is checksummed too
    for t, spec in zip(tensors, specs):
        if spec.nbytes:
            stream.narrow(0, spec.offset, spec.nbytes).copy_(t.reshape(-1).view(torch.uint8))
    return stream, specs


shapes = hs.lists(hs.tuples(hs.sampled_from(DTYPES), hs.lists(hs.integers(0, 40), max_size=3)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(shapes=shapes, chunk=hs.sampled_from([7, 64, 512, 4096]), threads=hs.integers(1, 4))
def test_upload_copies_every_tensor_and_checksums_the_whole_stream(shapes, chunk, threads):
    tensors = [torch.randint(0, 100, shape).to(dtype) if shape else torch.tensor(3).to(dtype) for dtype, shape in shapes]
    stream, specs = _stream(tensors)
    with ThreadPoolExecutor(4) as pool:
        crc, outs = upload.upload(stream, specs, [torch.device("cpu")] * len(specs),
                                  pool=pool, threads=threads, chunk=chunk)
    assert crc == memory.checksum(fmt.byte_view(stream))
    for t, out in zip(tensors, outs):
        assert out.dtype == t.dtype and out.shape == t.shape
        assert torch.equal(out.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))


@settings(max_examples=40, deadline=None)
@given(shapes=shapes, data=hs.data())
def test_a_flipped_byte_anywhere_changes_the_checksum(shapes, data):
    tensors = [torch.zeros(shape, dtype=dtype) for dtype, shape in shapes]
    stream, specs = _stream(tensors)
    if stream.numel() == 0:
        return
    good, _ = upload.upload(stream, specs, [torch.device("cpu")] * len(specs), chunk=64)
    at = data.draw(hs.integers(0, stream.numel() - 1))
    stream[at] ^= 0x10
    bad, _ = upload.upload(stream, specs, [torch.device("cpu")] * len(specs), chunk=64)
    assert bad != good


def test_pieces_cover_the_tensors_and_skip_padding():
    tensors = [torch.zeros(3, dtype=torch.uint8), torch.zeros(2, dtype=torch.float32)]
    specs, total = fmt.plan_stream(tensors)
    assert specs[1].offset > 3  # aligned: bytes 3..offset are padding
    got = upload.pieces(specs, 0, total)
    assert [(p.index, p.dst, p.src, p.nbytes) for p in got] == [(0, 0, 0, 3), (1, 0, specs[1].offset, 8)]
    # A range that starts inside the padding and ends inside the second tensor.
    got = upload.pieces(specs, 2, specs[1].offset + 4)
    assert [(p.index, p.dst, p.src, p.nbytes) for p in got] == [(0, 2, 2, 1), (1, 0, specs[1].offset, 4)]
    assert upload.pieces(specs, 3, specs[1].offset) == []

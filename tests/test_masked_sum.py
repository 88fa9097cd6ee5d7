"""The masked all-reduce over ranks (:mod:`ppdnmf_torch.distributed.masked_sum`): the total equals
the exact sum to the fixed point's rounding (a property test over random shapes, magnitudes and
sections on 2-4 spawned gloo ranks: every rank runs the same seeded sample of cases, one launch
per world size), the masks cancel while no rank's value, encoded value or seed crosses the wire,
int64 sums wrap modulo 2^64 (torch on CPU and gloo), and the single-rank contract (NaN,
integers, MAX, pickling, closing)."""
from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ppdnmf_torch.distributed import Comm, free_port, launch_local
from ppdnmf_torch.distributed.masked_sum import MIN_EXPONENT, MaskedSums, PlainSums, rank_sums

N_CASES = 12


def _cases() -> list:
    """``(shape, dtype, split, log2 magnitudes)``: the same on every rank."""
    rng = np.random.default_rng(5)
    out = []
    for c in range(N_CASES):
        shape = tuple(int(v) for v in rng.integers(1, 6, size=int(rng.integers(0, 4))))
        P = int(np.prod(shape)) if shape else 1
        cut = sorted(rng.choice(np.arange(1, P), size=min(P - 1, int(rng.integers(0, 3))), replace=False).tolist()) \
            if P > 1 else []
        split = None if not cut else np.diff([0] + cut + [P]).tolist()
        out.append((shape, torch.float64 if c % 3 else torch.float32, split, int(rng.integers(-40, 40))))
    return out


def _value(case: int, rank: int) -> torch.Tensor:
    shape, dtype, _, mag = _cases()[case]
    g = torch.Generator().manual_seed(1000 * case + rank)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2.0 ** mag
    x.view(-1)[0] *= 2.0 ** (5 * rank)  # unlike magnitudes across ranks too
    return x.to(dtype)


def _rank():
    """A spawned rank: the masked and the plain totals of every case, what it sent, the seeds its
    party derived (the test's copy) and a gloo int64 sum that wraps."""
    from ppdnmf_torch.exchange.secagg import party

    seeds, real = [], party._derive_seed

    def spy(shared, info):
        s = real(shared, info)
        seeds.extend([s, shared])
        return s

    party._derive_seed = spy
    with Comm.connect("env://", timeout=60, record=True) as comm:
        sums = MaskedSums(comm)
        masked, plain, sent = [], [], []
        for c, (_, _, split, _) in enumerate(_cases()):
            x = _value(c, comm.rank)
            before = len(comm.sent_log)
            masked.append(sums.all_reduce(x, category="metrics", what=f"case {c}", split=split))
            sent.append([m for cat, _, m in comm.sent_log[before:]])
            plain.append(comm.all_reduce(x.reshape(-1), category="metrics", what="plain").reshape(x.shape))
        rounds = sums.rounds
        sums.close()
        big = torch.tensor([2 ** 62 + comm.rank, -(2 ** 63) + 7], dtype=torch.int64)
        wrapped = comm.all_reduce(big, category="metrics", what="wrap")
    return {"masked": masked, "plain": plain, "sent": sent, "seeds": seeds, "rounds": rounds, "wrapped": wrapped}


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_the_masked_total_is_the_exact_sum_to_the_fixed_point_rounding(world):
    outs = launch_local(world, _rank, timeout=180, grace=20)
    assert [o.exitcode for o in outs] == [0] * world, [o.error for o in outs]
    b = world.bit_length()
    for c, (shape, dtype, split, _) in enumerate(_cases()):
        xs = [_value(c, r).to(torch.float64).reshape(-1) for r in range(world)]
        exact = torch.tensor([math.fsum(float(x[k]) for x in xs) for k in range(xs[0].numel())], dtype=torch.float64)
        sizes = [exact.numel()] if split is None else split
        at = 0
        for size in sizes:  # each section: |masked - exact| <= W 2^-(s+1) + the float64 total's conversion
            sec = slice(at, at + size)
            at += size
            E = max(max(int(np.frexp(float(x[sec].abs().max()))[1]), MIN_EXPONENT) for x in xs)
            tol = world * 2.0 ** (E + b - 63) + 2.0 ** (E + 1 - 53)
            for o in outs:
                m = o.value["masked"][c]
                assert m.shape == shape and m.dtype == dtype
                if dtype == torch.float64:
                    assert float((m.reshape(-1)[sec] - exact[sec]).abs().max()) <= tol
                else:  # one float32 rounding of the total
                    ref = exact[sec].to(torch.float32)
                    assert torch.allclose(m.reshape(-1)[sec], ref, rtol=0, atol=float(2.0 ** (E - 23)))
        # every rank decodes the same total, and it is the plain one to rounding
        assert all(torch.equal(o.value["masked"][c], outs[0].value["masked"][c]) for o in outs)
        rtol = 1e-6 if dtype == torch.float32 else 1e-13
        assert torch.allclose(outs[0].value["masked"][c], outs[0].value["plain"][c], rtol=rtol,
                              atol=rtol * float(exact.abs().max()))
    for r, o in enumerate(outs):
        assert o.value["rounds"] == N_CASES
        # gloo's int64 sum wraps modulo 2^64 (the ring the masks live in)
        want = np.array([sum(2 ** 62 + q for q in range(world)), world * (-(2 ** 63) + 7)], dtype=object)
        want = [int((v + 2 ** 63) % 2 ** 64 - 2 ** 63) for v in want]
        assert o.value["wrapped"].tolist() == want
        assert len(o.value["seeds"]) == 2 * (world - 1)
        blob = b"".join(m for case in o.value["sent"] for m in case)
        for other in outs:  # no seed or shared secret of any rank crosses
            assert not [s for s in other.value["seeds"] if s in blob]
    # the masked messages: int64 ring elements that are not the rank's value, nor its encoding;
    # summed over the ranks (mod 2^64) the masks cancel and the encoded total is left
    for c in range(N_CASES):
        x0 = _value(c, 0).to(torch.float64).reshape(-1)
        msgs = [np.frombuffer(o.value["sent"][c][-1], dtype=np.int64) for o in outs]
        assert not any(_value(c, r).numpy().tobytes() in o.value["sent"][c][-1] for r, o in enumerate(outs))
        total = np.zeros_like(msgs[0])
        for m in msgs:
            total = total + m  # numpy int64 wraps
        assert not np.array_equal(msgs[0], total)
        if c == 0 and x0.numel() > 0:
            assert all(abs(int(v)) > 2 ** 40 for m in msgs for v in m)  # masked: uniform on Z_2^64


def test_torch_int64_sums_wrap_on_cpu():
    t = torch.tensor([2 ** 63 - 1, -(2 ** 63)], dtype=torch.int64)
    assert (t + torch.tensor([1, -1])).tolist() == [-(2 ** 63), 2 ** 63 - 1]
    assert torch.tensor([2 ** 62] * 4, dtype=torch.int64).sum().item() == 0


@pytest.fixture(scope="module")
def solo():
    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=30, heartbeat=None)
    yield comm
    comm.close()


def test_one_rank_nonfinite_sections_integers_and_max(solo):
    sums = rank_sums(solo, "secagg")
    assert isinstance(sums, MaskedSums) and isinstance(rank_sums(solo, "quantized"), PlainSums)
    x = torch.tensor([1.5, float("nan"), 3.0, 1e-30], dtype=torch.float64)
    out = sums.all_reduce(x, category="metrics", what="t", split=[1, 2, 1])
    assert out[0] == 1.5 and out[1:3].isnan().all() and out[3] == 1e-30  # a section of its own keeps its scale
    assert sums.all_reduce(torch.zeros(3), category="metrics", what="z").tolist() == [0.0] * 3
    n = torch.tensor([3, 4], dtype=torch.int64)
    assert torch.equal(sums.all_reduce(n, category="metrics", what="n"), n)
    assert torch.equal(sums.all_reduce(x[:1], category="metrics", what="m", op=dist.ReduceOp.MAX), x[:1])
    assert sums.rounds == 2  # the integer and MAX calls are plain
    with pytest.raises(ValueError, match="^s: split \\[2\\] does not add up to the 4 entries"):
        sums.all_reduce(x, category="metrics", what="s", split=[2])
    for f in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled"):
            f(sums)
    assert "seed" not in repr(sums) and "rounds=2" in repr(sums)
    sums.close()
    with pytest.raises(RuntimeError, match="closed"):
        sums.all_reduce(x, category="metrics", what="after")

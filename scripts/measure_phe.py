"""Measure Paillier throughput per operation on this machine (raw layer and phe's naive API).

    python scripts/measure_phe.py [--bits 128 1024 2048] [--repeats 40] [--naive]

Times the raw layer the real stage uses (:class:`ppdnmf_torch.exchange.paillier.RawPaillier`:
``raw_encrypt``, ``raw_decrypt``, ciphertext products mod n^2, ``gmpy2.powmod`` with a
``--exponent-bits`` exponent) and, with ``--naive``, phe's ``EncryptedNumber`` API
(``encrypt``/``decrypt``/``+``/``*``) for comparison. Single core, serial.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import time


def _time(fn, n):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) / n


def measure(bits: int, repeats: int, exponent_bits: int, naive: bool) -> dict:
    import phe

    from ppdnmf_torch.exchange.paillier import RawPaillier

    t0 = time.perf_counter()
    pub, priv = phe.generate_paillier_keypair(n_length=bits)
    keygen = time.perf_counter() - t0
    raw = RawPaillier(None)
    rng = random.Random(bits)
    plain = [rng.randrange(-(1 << 40), 1 << 40) % pub.n for _ in range(repeats)]
    cts = raw.encrypt(pub, plain)
    k = rng.getrandbits(exponent_bits) | (1 << (exponent_bits - 1))
    add_reps = 50
    row = {
        "key_bits": bits,
        "keygen_s": keygen,
        "encrypt_s": _time(lambda: raw.encrypt(pub, plain), repeats),
        "decrypt_s": _time(lambda: raw.decrypt(priv, cts), repeats),
        "add_s": _time(lambda: [raw.add(pub, cts, cts) for _ in range(add_reps)], add_reps * repeats),
        "scalar_mul_s": _time(lambda: raw.scalar_mul(pub, cts, k), repeats),
    }
    assert raw.decrypt(priv, cts) == plain
    if naive:
        vals = [rng.uniform(-1, 1) for _ in range(repeats)]
        enc = []
        row["naive_encrypt_s"] = _time(lambda: enc.extend(pub.encrypt(v) for v in vals), repeats)
        row["naive_decrypt_s"] = _time(lambda: [priv.decrypt(e) for e in enc], repeats)
        row["naive_add_s"] = _time(lambda: [a + b for a, b in zip(enc, enc)], repeats)
        row["naive_scalar_mul_s"] = _time(lambda: [a * k for a in enc], repeats)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", type=int, nargs="+", default=[128, 1024, 2048])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--exponent-bits", type=int, default=32)
    ap.add_argument("--naive", action="store_true", help="also time phe's EncryptedNumber API")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = ap.parse_args(argv)
    rows = [measure(b, args.repeats, args.exponent_bits, args.naive) for b in args.bits]
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(), "rows": rows}, indent=1))
        return
    print(f"Paillier raw-layer throughput, one core ({platform.machine()}), "
          f"{args.repeats} repeats, scalar exponent {args.exponent_bits} bits")
    print(f"{'bits':>5} {'keygen s':>9} | {'encrypt':>16} | {'decrypt':>16} | {'hom. add':>18} | {'scalar mul':>16}")
    for r in rows:
        cells = [f"{r[k] * 1e6:9.1f}us {1 / r[k]:>8.0f}/s" for k in ("encrypt_s", "decrypt_s", "add_s", "scalar_mul_s")]
        print(f"{r['key_bits']:>5} {r['keygen_s']:>9.3f} | " + " | ".join(cells))
        if "naive_encrypt_s" in r:
            cells = [f"{r[k] * 1e6:9.1f}us {1 / r[k]:>8.0f}/s"
                     for k in ("naive_encrypt_s", "naive_decrypt_s", "naive_add_s", "naive_scalar_mul_s")]
            print(f"{'naive':>5} {'':>9} | " + " | ".join(cells))


if __name__ == "__main__":
    main()

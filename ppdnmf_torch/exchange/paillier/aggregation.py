"""``make_aggregator("paillier", K)``: secure aggregation with real Paillier keys and pairwise mask units.

Parties: ``K`` workers and a server, each with its own Paillier key pair (``_Agent``, :mod:`.keys`:
the only holder of its private key and seeds). The construction (docs/SECURE_AGGREGATION.md):

Setup, once per aggregator. Every worker sends its public key to the server, which relays the
workers' keys and its own to every worker. For every pair ``a < b`` of workers, ``a`` draws a 256-bit
seed ``s_ab`` from the OS CSPRNG, encrypts it under ``b``'s key and sends it to ``b`` through the
server (which cannot read it): the masked protocol's seed agreement (:mod:`.masked`), with the
server as the middle party.

Round ``r``. Worker ``i`` quantizes its upload (``q_i``, :mod:`..codec`), packs it into ``C`` plaintexts
of ``S`` signed slots (:mod:`..packing`), embeds each as ``(1 + n M_b) mod n^2`` under the server's
key ``n`` (the designated worker, worker 0, and with ``obfuscators="every"`` every worker, times a
fresh obfuscator ``rho^n``: a full encryption ``E_S(M_b)``), and multiplies it by its mask unit

    U_{i,b} = prod_{k != i} mu(s_ik, r, b)^{sigma_ik},     sigma_ik = +1 if i < k else -1,

``mu`` the uniform units of ``Z*_{n^2}`` that :func:`.seeds.unit_stream` draws from a seed (SHAKE-256,
the round and the server's index). ``prod_i U_{i,b} = 1``: the server multiplies the ``K`` uploads
block by block and decrypts only their product, ``E_S(M_b(sum_i q_i))``, whose slots are the exact
integer sums (offsets added at decoding, :meth:`.packing.SlotLayout.unpack`). Each upload on its
own decrypts, under the server's key, to ``M_b(q_i)`` plus a plaintext mask that is uniform mod
``n`` to the server (for ``K >= 2``).

Fresh obfuscators. A mask unit is a uniform unit of ``Z*_{n^2}`` to anyone without the seeds, i.e.
``(1 + u n) t^n`` with uniform ``u`` and ``t``: it re-randomizes the upload as an obfuscator would, so
every upload on its own is a uniform element of ``Z*_{n^2}`` to an eavesdropper (who has no seed) and
to the server. Only the product, where the units cancel, needs randomness of its own, so that it is
a fresh encryption of the sum and not ``1 + n sum``: the designated worker's obfuscators give it
(the masked protocol's designated neighbour, :mod:`.masked`). ``obfuscators="every"`` (every worker
a full encryption, ``K`` times the obfuscators) is kept for comparison.
"""
from __future__ import annotations

import time
import warnings

import gmpy2
import torch

from ..secure_sum import DEFAULT_N_MAX, IntegerAggregator, check_obfuscators, round_counts, setup_counts
from ..costmodel import ciphertext_nbytes, seed_chunks
from ..spec import SECURE_KEY_BITS
from .keys import EncryptedVector, InsecureKeyWarning, RawPaillier, check_key_bits, generate_keypairs, make_agents
from .obfuscation import default_djn_exponent_bits, public_obfuscators

__all__ = ["PaillierAggregator"]


def _tag(a: int, b: int) -> tuple:
    return ("aggregate", min(a, b), max(a, b))


class PaillierAggregator(IntegerAggregator):
    """``kind="paillier"`` (module docstring). Parameters as :class:`~..aggregation.QuantizedAggregator`,
    plus ``keypairs`` (``K + 1`` pre-made key pairs of ``key_bits`` bits, the server's last; tests) and
    ``djn`` (DJN short-exponent obfuscators for the encryptions, :mod:`.obfuscation`) and ``obfuscators``
    (``"designated"``, the default: worker 0 adds fresh obfuscators; ``"every"``: every worker does).

    Costs (measured): ``encryptions``, ``mask_units``, ``homomorphic_additions``, ``decryptions``,
    ``bytes`` (the uploads' ciphertexts) per round; ``setup_encryptions``, ``setup_decryptions``,
    ``setup_bytes``, ``key_pairs`` once; seconds per step.
    """

    kind = "paillier"
    __slots__ = ()

    def __init__(self, n_workers: int, *, n_max=DEFAULT_N_MAX, bits=None, key_bits: int = SECURE_KEY_BITS,
                 record: bool = False, mask_neighbours=None, keypairs=None, djn: bool = False,
                 obfuscators: str = "designated"):
        super().__init__(n_workers, n_max=n_max, bits=bits, key_bits=key_bits, record=record,
                         mask_neighbours=mask_neighbours)
        check_key_bits(key_bits)
        if key_bits < SECURE_KEY_BITS:
            warnings.warn(f"{key_bits}-bit Paillier keys are for experiments only (use {SECURE_KEY_BITS} bits)",
                          InsecureKeyWarning, stacklevel=3)
        check_obfuscators(obfuscators)
        self.obfuscators = obfuscators
        K = self.n_workers
        self._djn_bits = default_djn_exponent_bits(key_bits) if djn else None
        t0 = time.perf_counter()
        if keypairs is None:
            keypairs = generate_keypairs(key_bits, K + 1)
            t0 = self._timed("seconds_keygen", t0)
        agents = make_agents(list(keypairs), n_nodes=K + 1, n_agents=K + 1, codec=self.codec,
                             raw=RawPaillier(None))
        for ag in agents:
            ag._enable_fast(own_mode="crt")
        self._workers, self._server = agents[:K], agents[K]
        self._tags = [[] for _ in range(K)]
        for a, b in self.pairs:
            self._tags[a].append((_tag(a, b), 1))
            self._tags[b].append((_tag(a, b), -1))
        self._agree_seeds()
        self._timed("seconds_setup", t0)

    def _agree_seeds(self) -> None:
        K, kb = self.n_workers, self.key_bits
        chunks = seed_chunks(kb)
        for a, b in self.pairs:
            peer = self._workers[b]
            cts = self._workers[a].draw_seed_for(_tag(a, b), peer.public_key,
                                                 public_obfuscators(peer.n, chunks, self._djn_bits))
            peer.store_seed(_tag(a, b), EncryptedVector(peer.public_key, cts))  # a -> server -> b
        for k, v in setup_counts(K, key_bits=kb, mask_neighbours=self.mask_neighbours).items():
            self._add(k, v)

    def _masked_sum(self, q):
        K, P = q.shape
        lay, server, rnd = self.layout, self._server, self.rounds
        n, nsq = server.n, server.nsquare
        C = lay.n_ciphertexts(P)
        qh = q.cpu().tolist()
        uploads = []
        for i, worker in enumerate(self._workers):  # each worker's own upload
            t0 = time.perf_counter()
            cts = [(1 + n * gmpy2.mpz(m)) % nsq for m in lay.pack(qh[i], n)]
            if i == 0 or self.obfuscators == "every":  # fresh randomness for the product (module docstring)
                cts = [c * r % nsq for c, r in zip(cts, public_obfuscators(n, C, self._djn_bits), strict=True)]
            t0 = self._timed("seconds_encrypt", t0)
            units = worker.mask_units(self._tags[i], K, rnd, n, C)
            uploads.append([c * u % nsq for c, u in zip(cts, units, strict=True)])
            self._timed("seconds_mask", t0)
        t0 = time.perf_counter()
        prod = list(uploads[0])
        for up in uploads[1:]:  # the server: only the product
            prod = [a * b % nsq for a, b in zip(prod, up)]
        t0 = self._timed("seconds_aggregate", t0)
        sums = server.decrypt_packed(EncryptedVector(server.public_key, prod), lay, P, admm_iter=rnd)
        self._timed("seconds_decrypt", t0)
        counts = round_counts(K, P, key_bits=self.key_bits, bits=self.bits, mask_neighbours=self.mask_neighbours,
                              obfuscators=self.obfuscators)
        for key in ("encryptions", "mask_units", "homomorphic_additions", "decryptions"):
            self._add(key, counts[key])
        self._add("bytes", K * C * ciphertext_nbytes(self.key_bits))
        if self.record:
            self.transcript.append({"round": rnd, "uploads": [[int(c) for c in up] for up in uploads],
                                    "modulus": int(n)})
        return torch.tensor(sums, dtype=torch.int64).reshape(P)

    # -- what the audit's adversaries can compute (never a key or a seed) -----------------------
    def _decrypt_as_server(self, ciphertexts) -> list:
        """The curious server decrypts any ciphertexts under its key: residues mod ``n``."""
        return [int(r) for r in self._server.decrypt_residues(EncryptedVector(self._server.public_key,
                                                                               [gmpy2.mpz(c) for c in ciphertexts]))]

    def _pair_units(self, worker: int, peer: int, round_no: int, count: int) -> list:
        """What ``worker`` computes from its seed shared with ``peer``: the pair's units ``mu`` of a round."""
        return self._workers[worker].mask_units([(_tag(worker, peer), 1)], self.n_workers, round_no,
                                                self._server.n, count)

    @property
    def server_modulus(self) -> int:
        return int(self._server.n)

    def _forget(self) -> None:
        for ag in getattr(self, "_workers", ()):
            ag._seeds.clear()
        self._workers, self._server = (), None

    def __repr__(self) -> str:
        K = self.n_workers
        return (f"PaillierAggregator(n_workers={K}, n_max={self.n_max:g}, bits={self.bits}, "
                f"key_bits={self.key_bits}, slots={self.layout.slots}, obfuscators={self.obfuscators!r}, "
                f"rounds={self.rounds}, "
                f"{len(self.pairs) if self._server is not None else 0} pair seeds)")

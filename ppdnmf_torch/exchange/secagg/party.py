"""One party of the pairwise-masked secure sum: its keys, its seeds and the masks it computes.

Every party (an agent, a worker, the server) holds

* an **identity key** (Ed25519): its public half stands for the party in a public-key
  infrastructure that every party trusts (in the library: handed to every party when the run
  starts); it signs the party's ephemeral key;
* an **ephemeral key** (X25519), fresh for every run (and for every resumed run): its public
  half travels with its signature (:class:`SignedKey`), the private half stays here and is
  dropped once the seeds are agreed (:meth:`Party.finish_setup`);
* its **seeds**, each agreed with one peer (RFC 7748 X25519, then HKDF-SHA256, RFC 5869, over
  the shared secret, with the seed's tag and both ephemeral keys as context), kept only as
  the AES-128 contexts of the mask PRG (:mod:`.prg`).

Nothing here returns a private key or a seed: :meth:`Party.fill` writes the keystreams the protocol
asks for (the masks) into a buffer, which is all the protocol needs. Like every holder of key
material in the library (:class:`~..sealed.HoldsPrivateKey`) a party refuses pickling and copying,
its repr shows counts, and :meth:`Party.forget` drops everything.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ...errors import PPDNMFError
from ..sealed import HoldsPrivateKey
from .prg import SEED_BYTES, aes_context

__all__ = ["Party", "SignedKey", "KeyAgreementError", "SIGNED_KEY_BYTES", "DOMAIN"]

DOMAIN = b"ppdnmf-secagg-v1"
#: bytes of a signed key on the wire: node id (4), X25519 public key (32), Ed25519 signature (64)
SIGNED_KEY_BYTES = 4 + 32 + 64


class KeyAgreementError(PPDNMFError):
    """A signed key that does not verify against its party's identity key (a relay changed it)."""


# the key material's sources; the key-hygiene test and the audit watch them (nothing else sees it)
def _new_identity() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _new_ephemeral() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def _derive_seed(shared: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None, info=info).derive(shared)


def _signed_message(node: int, key: bytes) -> bytes:
    return DOMAIN + b"|key|" + struct.pack(">I", int(node)) + key


def _tag_bytes(tag: tuple) -> bytes:
    return tag[0].encode() + struct.pack(f">{len(tag) - 1}I", *(int(v) for v in tag[1:]))


@dataclass(frozen=True)
class SignedKey:
    """A party's ephemeral public key, signed with its identity key: public, on the wire."""

    node: int
    key: bytes
    signature: bytes

    def to_bytes(self) -> bytes:
        return struct.pack(">I", self.node) + self.key + self.signature

    @classmethod
    def from_bytes(cls, raw: bytes) -> "SignedKey":
        if len(raw) != SIGNED_KEY_BYTES:
            raise ValueError(f"a signed key has {SIGNED_KEY_BYTES} bytes, got {len(raw)}")
        return cls(struct.unpack(">I", raw[:4])[0], bytes(raw[4:36]), bytes(raw[36:]))


class Party(HoldsPrivateKey):
    """Party ``node`` (module docstring).

    Counters (public numbers): ``key_agreements`` (X25519 operations), ``verifications`` (signatures
    checked), ``signatures`` (made).
    """

    __slots__ = ("node", "identity_key", "signed_key", "_identity", "_ephemeral", "_ctx", "_work", "key_agreements",
                 "verifications", "signatures")

    def __init__(self, node: int):
        self.node = int(node)
        self._identity = _new_identity()
        self._ephemeral = _new_ephemeral()
        #: the public identity key (32 bytes): what the public-key infrastructure publishes
        self.identity_key = self._identity.public_key().public_bytes_raw()
        epk = self._ephemeral.public_key().public_bytes_raw()
        self.signed_key = SignedKey(self.node, epk, self._identity.sign(_signed_message(self.node, epk)))
        self._ctx = {}
        self._work = {}
        self.key_agreements = self.verifications = 0
        self.signatures = 1

    def verify(self, signed: SignedKey, node: int, identity_key: bytes, via: int | None = None) -> None:
        """Check that ``signed`` is ``node``'s key, signed with ``node``'s identity key.

        Raises
        ------
        KeyAgreementError
            Naming this party, ``node`` and the relay ``via``.
        """
        self.verifications += 1
        ok = signed.node == int(node)
        if ok:
            try:
                Ed25519PublicKey.from_public_bytes(identity_key).verify(signed.signature,
                                                                        _signed_message(node, signed.key))
            except InvalidSignature:
                ok = False
        if not ok:
            hop = "" if via is None else f" relayed by party {via}"
            raise KeyAgreementError(f"secagg: party {self.node}: the key of party {node}{hop} does not verify "
                                    "against its identity key; the seed agreement stops (a relay changed it)")

    def agree(self, peer: SignedKey, tags) -> None:
        """Derive and keep the seeds ``tags`` shared with ``peer`` (whose key was verified)."""
        if self._ephemeral is None:
            raise RuntimeError(f"secagg: party {self.node}: its setup is over (the ephemeral key is gone)")
        shared = self._ephemeral.exchange(X25519PublicKey.from_public_bytes(peer.key))
        self.key_agreements += 1
        keys = b"".join(sorted((self.signed_key.key, peer.key)))
        for tag in tags:
            self._ctx[tag] = aes_context(_derive_seed(shared, DOMAIN + b"|" + _tag_bytes(tag) + b"|" + keys))
        del shared

    def finish_setup(self) -> None:
        """Drop the ephemeral private key: the seeds are agreed (forward secrecy of a finished run)."""
        self._ephemeral = None

    def has(self, tag) -> bool:
        return tag in self._ctx

    def fill(self, jobs, counters: dict, rows) -> None:
        """Write keystreams into ``rows`` (:func:`~.prg.stream_rows`): ``jobs`` is ``[(row, tag, receiver), ...]``
        and ``counters[receiver]`` the round's counter blocks for that receiver (:func:`~.prg.counter_blocks`)."""
        ctx = self._ctx
        for row, tag, receiver in jobs:
            ctx[tag].update_into(counters[receiver], rows[row])

    def prepare(self, key, jobs) -> None:
        """Keep ready the work ``key`` of every round: ``jobs`` is ``[(tag, counter blocks, out), ...]``,
        buffers the caller rewrites each round (the counters) and reads (the keystreams)."""
        self._work[key] = [(self._ctx[tag], counters, out) for tag, counters, out in jobs]

    def run(self, key) -> None:
        """The keystreams of the work ``key`` (:meth:`prepare`) for the counters now in its buffers."""
        for ctx, counters, out in self._work[key]:
            ctx.update_into(counters, out)

    def forget(self) -> None:
        """Drop every key and seed (the exchange closed)."""
        self._identity = self._ephemeral = None
        self._ctx = {}
        self._work = {}

    def __len__(self) -> int:
        return len(self._ctx)

    def __repr__(self) -> str:
        return f"Party(node={self.node}, {len(self._ctx)} seeds)"

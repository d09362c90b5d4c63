"""The XOR ciphers benchmarks use to keep their questions out of web crawls.

Both publish base64 text XOR-ed with a key taken from the row's ``canary`` column:

* ``sha256_xor`` (BrowseComp, simple-evals' ``browsecomp_eval.py``): the key is the SHA-256 digest of the
  canary, repeated to the length of the message;
* ``xor`` (xbench-DeepSearch): the key is the canary's own UTF-8 bytes, repeated.

A wrong canary does not fail the XOR itself; it shows as bytes that are not UTF-8 text, which is what
``decrypt`` reports (``CipherError``), so the loader can say so in one line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from enum import StrEnum


class Cipher(StrEnum):
    NONE = "none"
    SHA256_XOR = "sha256_xor"
    XOR = "xor"


class CipherError(ValueError):
    """The text could not be decrypted: not base64, or not UTF-8 once decrypted (a wrong canary)."""


def _key(cipher: Cipher, canary: str, length: int) -> bytes:
    seed = hashlib.sha256(canary.encode()).digest() if cipher is Cipher.SHA256_XOR else canary.encode()
    if not seed:
        raise CipherError("the canary is empty")
    repeats, rest = divmod(length, len(seed))
    return seed * repeats + seed[:rest]


def _xor(data: bytes, key: bytes) -> bytes:
    # One big-integer XOR instead of a Python loop per byte: questions can be kilobytes long.
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(len(data), "big")


def encrypt(plain: str, canary: str, cipher: Cipher) -> str:
    """The published form of ``plain`` (used to build fixtures; XOR is its own inverse)."""
    if cipher is Cipher.NONE:
        return plain
    data = plain.encode()
    return base64.b64encode(_xor(data, _key(cipher, canary, len(data)))).decode()


def decrypt(text: str, canary: str, cipher: Cipher) -> str:
    if cipher is Cipher.NONE:
        return text
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise CipherError("not base64 text (is the file already decrypted? then set dataset.decrypt=none)") from None
    try:
        plain = _xor(data, _key(cipher, canary, len(data))).decode("utf-8")
    except UnicodeDecodeError:
        raise CipherError("the decrypted bytes are not UTF-8 text: wrong canary") from None
    # XOR with a wrong key can still happen to be valid UTF-8; real questions hold no control characters.
    if any(ord(c) < 32 and c not in "\n\r\t" for c in plain):
        raise CipherError("the decrypted text holds control characters: wrong canary")
    return plain

"""A digest of a whole generation request: what tells an idempotent retry from a reused
`client_request_id` (inference.proto SubmitRequest.client_request_id: the request must be
identical, else FAILED_PRECONDITION).

Two requests get the same digest exactly when every field is equal: model, prompt and resume
tokens, sampling, stopping, priority, session id, labels, and the id itself; the deadline is left
out (a retry sends its remaining budget, see `RETRY_MAY_CHANGE`), and so is the trace (request id
and trace context name the attempt). The fields
are walked generically (dataclass fields, recursively), so a field added to `GenerationRequest`
later is covered without a change here. The seed is the one special case: a Submit without a seed
gets one drawn by the wire layer, so a retry of the same seed-less request carries another drawn
value. The digest records "unset" instead of the drawn seed (and an explicit seed by its value):
the retry still matches, and a request that names a seed differs from one that did not.

Cost: token sequences are packed into arrays (one C loop each), not hashed token by token in
Python; still O(prompt), so callers compute it outside the engine lock.
"""

from __future__ import annotations

import array
import dataclasses
import enum
import hashlib
import struct
from collections.abc import Sequence
from typing import Any

from calculet.daemon.core.request import GenerationRequest
from calculet.daemon.sampling.params import SamplingParams

DIGEST_BYTES = 32
# Fields a faithful retry may change: inference.proto tells a retrying client to send the
# *remaining* time budget as deadline_ms, so the deadline is not part of the request's identity.
# The trace (request id, trace context) names the attempt, not the request.
RETRY_MAY_CHANGE = frozenset({"deadline_s", "trace"})
_PERSON = b"calculet-req-v1"  # domain separation: no other blake2b use in the daemon collides with these


def request_digest(req: GenerationRequest, *, seed_given: bool) -> bytes:
    """The request's identity for deduplication.

    Args:
        req: the request as the engine will run it.
        seed_given: the caller set the seed; False when it was drawn for this Submit (then the
            drawn value is left out and "unset" is hashed in its place).

    Returns:
        A 32-byte BLAKE2b digest.

    Raises:
        TypeError: a request field of a type this module does not know how to encode (a bug:
            extend `_feed` for the new field).
    """
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=_PERSON)
    _feed(h, req, seed_given)
    return h.digest()


def _feed(h: Any, value: object, seed_given: bool) -> None:
    """Append an unambiguous encoding of `value`: a type tag, then length-prefixed content."""
    if value is None:
        _put(h, b"N", b"")
    elif isinstance(value, bool):  # before int: bool is an int subclass
        _put(h, b"B", b"1" if value else b"0")
    elif isinstance(value, int):
        _put(h, b"I", str(value).encode())
    elif isinstance(value, float):
        _put(h, b"R", value.hex().encode())  # exact; -0.0 and 0.0 differ, NaN is never valid here
    elif isinstance(value, str):
        _put(h, b"S", value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, enum.Enum):
        _put(h, b"E", f"{type(value).__qualname__}.{value.name}".encode())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        _feed_dataclass(h, value, seed_given)
    elif isinstance(value, tuple | list):
        _feed_sequence(h, value, seed_given)
    elif isinstance(value, dict):
        _put(h, b"M", struct.pack("<Q", len(value)))
        for key in sorted(value, key=repr):
            _feed(h, key, seed_given)
            _feed(h, value[key], seed_given)
    elif isinstance(value, frozenset | set):
        _feed_sequence(h, sorted(value, key=repr), seed_given, tag=b"T")
    else:
        raise TypeError(f"request_digest: cannot encode a {type(value).__name__} field")


def _feed_dataclass(h: Any, value: Any, seed_given: bool) -> None:
    fields = dataclasses.fields(value)
    _put(h, b"D", f"{type(value).__qualname__}/{len(fields)}".encode())
    for f in fields:
        _put(h, b"F", f.name.encode())
        if isinstance(value, SamplingParams) and f.name == "seed" and not seed_given:
            _put(h, b"U", b"")  # drawn for this Submit: not part of what the caller asked for
        elif isinstance(value, GenerationRequest) and f.name in RETRY_MAY_CHANGE:
            _put(h, b"U", b"")
        else:
            _feed(h, getattr(value, f.name), seed_given)


def _feed_sequence(h: Any, items: Sequence[object], seed_given: bool, tag: bytes = b"L") -> None:
    packed = _packed_ints(items)
    if packed is not None:
        _put(h, tag + packed[0], packed[1])
        return
    _put(h, tag, struct.pack("<Q", len(items)))
    for item in items:
        _feed(h, item, seed_given)


def _packed_ints(items: Sequence[Any]) -> tuple[bytes, memoryview] | None:
    """Integers (token ids) as one native-endian array, uint32 first (the wire's type, and the
    fastest to pack), else int64; None when they are not all integers that fit. The digest lives
    only in this process's memory, so native byte order is fine."""
    for code in ("I", "q"):
        try:
            packed = array.array(code, items)  # refuses anything but integers
        except (OverflowError, TypeError):
            continue
        return code.encode(), memoryview(packed).cast("B")
    return None


def _put(h: Any, tag: bytes, content: bytes | memoryview) -> None:
    h.update(tag)
    h.update(struct.pack("<Q", len(content)))
    h.update(content)

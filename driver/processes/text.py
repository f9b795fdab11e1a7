"""Output bytes as `process.output` text (PROTOCOL §6.8): UTF-8, invalid bytes as U+FFFD, offsets in
raw bytes. Free of I/O.

A read may end inside a multi-byte character; `complete_length` tells how much of a chunk can be sent
now, so a character is never split across two events (which would turn it into two U+FFFD).
"""

from __future__ import annotations

from collections.abc import Iterator

# Characters of an event's data may grow six-fold when JSON-encoded (a control byte is `\\u0001`):
# a raw chunk of at most (max_event_bytes - envelope) / 6 never needs the §4.3 cut, which would lose bytes.
JSON_GROWTH = 6
PAYLOAD_OVERHEAD = 256  # process_id, offset and the field names
TAIL_BYTES = 4096


def chunk_limit(max_event_bytes: int, ceiling: int = 64 * 1024) -> int:
    """The most raw bytes one `process.output` may carry under `max_event_bytes`."""
    return max(64, min(ceiling, (max_event_bytes - PAYLOAD_OVERHEAD) // JSON_GROWTH))


def _sequence_length(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 1  # a continuation byte or an invalid lead: a character of its own (U+FFFD)


def complete_length(data: bytes) -> int:
    """The length of the longest prefix of `data` that does not end inside a character that the next
    bytes could still complete. At most 3 bytes are held back."""
    n = len(data)
    for back in range(1, min(4, n + 1)):
        b = data[n - back]
        if b < 0x80:
            return n  # ASCII: nothing pending
        if b >= 0xC0:  # a lead byte `back` bytes from the end
            need = _sequence_length(b)
            return n - back if need > back else n
    return n  # only continuation bytes at the end: invalid already, nothing to wait for


def decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def tail_of(data: bytes, *, cut: bool) -> str:
    """The last bytes of the output as text; when they were `cut` from a longer output, starting at a
    character boundary (the continuation bytes of a character begun before the tail are left out)."""
    skip = 0
    while cut and skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    return decode(data[skip:])


def output_chunks(data: bytes, limit: int, *, truncated_before: bool = False) -> Iterator[tuple[int, bytes]]:
    """`data` as the (offset within `data`, bytes) of its `process.output` events: at most `limit`
    bytes each, cut between characters. `truncated_before` with nothing left to resend: one empty
    piece, for the event that says so."""
    at = 0
    while at < len(data) or (at == 0 and truncated_before):
        piece = data[at : at + limit]
        n = len(piece)
        if at + n < len(data):
            n = complete_length(piece) or n
        yield at, piece[:n]
        at += n
        if n == 0:
            break


def live_split(pending: bytes, data: bytes, *, final: bool) -> tuple[bytes, bytes]:
    """What of a read (after the `pending` start of a character) can go out now, and what waits for
    the next read to complete its last character. `final`: the output ended, everything goes."""
    buf = pending + data
    n = len(buf) if final else complete_length(buf)
    return buf[:n], buf[n:]

"""The script: each step plays the driver's part of PROTOCOL.md and judges the control plane's.

The steps run in order on links of the kit's own (`Peer`), because each needs what the one before set
up (a welcome, accepted events, a current epoch). A step whose prerequisite failed says SKIP and why.
Epochs start at the current Unix time in tenths of a second, so a later run of the kit against the same
control plane (which remembers the highest epoch it saw, as it must) starts above the epochs an earlier
one used; seqs start at epoch x 1,000 (a run uses far fewer), which stays below 2**53 for JavaScript.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from agent_lab.conformance.api import Api, ApiError
from agent_lab.conformance.peer import Frame, Peer, probe_event
from driver.protocol.frames import SUBPROTOCOL, FrameError, Receipt, Welcome, decode_inbound

Outcome = Literal["PASS", "FAIL", "SKIP"]
CLOSE_NAMES = {
    1000: "normal",
    1001: "going away",
    1006: "abnormal, no close frame",
    1009: "message too big",
    1011: "internal error",
    4400: "protocol violation",
    4401: "bad or revoked token",
    4403: "instance not allowed",
    4408: "heartbeat timeout",
    4409: "superseded",
    4410: "terminated",
}


def close_text(code: int | None, reason: str = "") -> str:
    name = CLOSE_NAMES.get(code or 0, "")
    return f"closed {code}{f' ({name})' if name else ''}{f': {reason}' if reason else ''}"


@dataclass
class Verdict:
    rule: str
    outcome: Outcome
    detail: str

    def line(self) -> str:
        return f"{self.outcome} {self.rule}: {self.detail}"


@dataclass
class Config:
    url: str
    token: str
    instance: str
    api: Api | None = None
    timeout: float = 5.0
    epoch: int = field(default_factory=lambda: int(time.time() * 10))
    liveness: bool = True


class Kit:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.verdicts: list[Verdict] = []
        self.epoch = cfg.epoch
        self.next_seq = cfg.epoch * 1_000
        self.first_seq = self.next_seq
        self.batch = 0
        self.accepted: dict[str, Frame] = {}  # every event a receipt accepted, by id
        self.welcome: Welcome | None = None
        self.peers: list[Peer] = []

    def peer(self, token: str | None = None) -> Peer:
        p = Peer(self.cfg.url, self.cfg.token if token is None else token, self.cfg.instance)
        self.peers.append(p)
        return p

    def say(self, rule: str, ok: bool, detail: str) -> bool:
        self.verdicts.append(Verdict(rule, "PASS" if ok else "FAIL", detail))
        return ok

    def skip(self, rules: list[str], why: str) -> None:
        self.verdicts += [Verdict(r, "SKIP", why) for r in rules]

    def new_events(self, n: int, epoch: int | None = None, message: str = "") -> list[Frame]:
        out = []
        for _ in range(n):
            self.next_seq += 1
            out.append(probe_event(self.cfg.instance, epoch or self.epoch, self.next_seq, message))
        return out

    # -- the link's two ends -------------------------------------------------------------------

    async def open(self, epoch: int, last_command_seq: int = 0) -> tuple[Peer, Frame | None]:
        p = self.peer()
        first = await p.open(epoch, last_command_seq, timeout=max(10.0, self.cfg.timeout))
        return p, first

    def refused(self, p: Peer) -> str:
        if p.refused_http is not None:
            return f"the upgrade was answered HTTP {p.refused_http}"
        if p.closed is not None:
            return close_text(p.closed.code, p.closed.reason)
        return f"nothing within {max(10.0, self.cfg.timeout):g} s"

    async def deliver(self, p: Peer, events: list[Frame], rounds: int = 10) -> tuple[set[str], str]:
        """Send `events` in one batch, then resend what a receipt left out or rejected as retryable,
        as a driver does, up to `rounds` batches. (ids never accepted, what happened on the way)."""
        pending = {e["event_id"]: e for e in events}
        order = [e["event_id"] for e in events]
        left_out = retried = 0
        for _ in range(rounds):
            if not pending:
                break
            self.batch += 1
            batch = self.batch
            ids = [i for i in dict.fromkeys(order) if i in pending]
            sent = [pending[i] for i in order if i in pending]
            if not await p.events(batch, sent):
                return set(pending), f"the link closed before batch {batch} ({self.refused(p)})"

            def answers(f: Frame, b: int = batch) -> bool:
                return f.get("type") == "receipt" and f.get("batch") == b

            receipt = await p.wait_frame(answers, self.cfg.timeout)
            if receipt is None:
                return set(pending), f"no receipt for batch {batch} within {self.cfg.timeout:g} s" + (
                    f" ({self.refused(p)})" if p.closed else ""
                )
            try:
                parsed = decode_inbound(msgspec.json.encode(receipt))
            except FrameError as exc:
                return set(pending), f"receipt for batch {batch} is malformed: {exc}"
            assert isinstance(parsed, Receipt)
            foreign = (set(parsed.accepted) | {r.event_id for r in parsed.rejected}) - set(ids)
            if foreign:
                return set(pending), f"receipt for batch {batch} names events not in it: {sorted(foreign)[:3]}"
            for event_id in parsed.accepted:
                if event_id in pending:
                    self.accepted[event_id] = pending.pop(event_id)
            for r in parsed.rejected:
                if not r.retryable:
                    return set(pending), f"valid event {r.event_id} rejected for good: {r.code}: {r.message}"
                retried += 1
            left_out += len([i for i in ids if i in pending]) - len(
                [r for r in parsed.rejected if r.event_id in pending]
            )
        note = f"{left_out} left out of a receipt and resent, {retried} rejected as retryable and resent"
        if pending:
            return set(pending), f"{len(pending)} valid events never accepted in {rounds} batches ({note})"
        return set(), note

    # -- the rules -----------------------------------------------------------------------------

    async def run(self) -> list[Verdict]:
        from agent_lab.conformance.lifecycle import commands, epochs, liveness

        try:
            p = await self.handshake()
            if p is None:
                self.skip(
                    ["events.*", "epoch.*", "commands.*", "liveness.*"], "needs a welcome (handshake.welcome failed)"
                )
                return self.verdicts
            p = await self.events(p)
            p = await epochs(self, p)
            if p is None:
                self.skip(["commands.*", "liveness.*"], "needs a link with the newer epoch (epoch.supersede failed)")
                return self.verdicts
            p = await commands(self, p)
            await liveness(self, p)
        finally:
            for peer in self.peers:
                await peer.close()
        return self.verdicts

    async def handshake(self) -> Peer | None:
        bad = self.peer(token=self.cfg.token + "-not")
        first = await bad.open(self.epoch)
        if bad.closed is None and bad.refused_http is None:
            await bad.wait_closed(self.cfg.timeout)
        refused = bad.refused_http in (401, 403) or (bad.closed is not None and bad.closed.code == 4401)
        welcomed = first is not None and first.get("type") == "welcome"
        self.say("handshake.bad_token", refused and not welcomed, f"a wrong token: {self.refused(bad)}")
        await bad.close()

        p, first = await self.open(self.epoch)
        if first is None or first.get("type") != "welcome":
            what = self.refused(p) if first is None else f"first frame was {first.get('type')!r}, not welcome"
            self.say("handshake.welcome", False, f"hello with epoch {self.epoch}: {what}")
            return None
        try:
            welcome = decode_inbound(msgspec.json.encode(first))
            assert isinstance(welcome, Welcome)
            self.welcome = welcome
        except FrameError as exc:
            self.say("handshake.welcome", False, f"the welcome does not decode: {exc}")
            return None
        self.say(
            "handshake.welcome", True, f"welcome {welcome.connection_id}, heartbeat {welcome.heartbeat_interval_ms} ms"
        )
        assert p.ws is not None
        self.say("handshake.subprotocol", p.ws.subprotocol == SUBPROTOCOL, f"the CP chose {p.ws.subprotocol!r}")
        return p

    async def events(self, p: Peer) -> Peer:
        """Batches, partial receipts and resends, duplicates, a redial, a full batch, the store."""
        missing, note = await self.deliver(p, self.new_events(5), rounds=1)
        receipt_ok = "no receipt" not in note and "malformed" not in note and "names events" not in note
        self.say("events.receipt", receipt_ok, "batch of 5 answered by its receipt" if receipt_ok else note)
        if not receipt_ok:
            rest = ["events.accepted", "events.duplicates", "events.redial", "events.big_batch", "events.stored"]
            self.skip(rest, "needs receipts (events.receipt failed)")
            return p
        missing, note = await self.deliver(p, self.new_events(5))
        self.say("events.accepted", not missing, f"valid events all accepted ({note})" if not missing else note)

        again = list(self.accepted.values())[:2]
        fresh = self.new_events(2)
        missing, note = await self.deliver(p, [*again, *fresh, fresh[0]])
        self.say(
            "events.duplicates",
            not missing,
            "a batch of 2 stored events, 2 new ones and one of them twice: all accepted" if not missing else note,
        )

        await p.close()
        p, first = await self.open(self.epoch)
        if first is None or first.get("type") != "welcome":
            self.say("events.redial", False, f"a redial with the same epoch {self.epoch}: {self.refused(p)}")
            return p
        missing, note = await self.deliver(p, list(self.accepted.values())[:3] + self.new_events(1))
        self.say(
            "events.redial",
            not missing,
            "redial with the same epoch welcomed; receipted events accepted again" if not missing else note,
        )

        await self.big_batch(p)
        if p.closed is not None:  # e.g. 1009 on the big batch: the next steps need a link, as a driver redials
            p, _ = await self.open(self.epoch)
        await self.stored()
        return p

    async def big_batch(self, p: Peer) -> None:
        assert self.welcome is not None
        limit = min(self.welcome.max_batch_bytes, 4 * 1024 * 1024)
        per_event = max(1024, min(self.welcome.max_event_bytes, limit) - 1024)
        count = max(1, min(self.welcome.max_batch_events, int(limit * 0.9) // (per_event + 512)))
        events = self.new_events(count, message="x" * (per_event - 512))
        size = len(msgspec.json.encode({"type": "events", "batch": 0, "events": events}))
        missing, note = await self.deliver(p, events)
        self.say(
            "events.big_batch",
            not missing,
            f"a {size:,}-byte batch (max_batch_bytes {limit:,}) accepted"
            if not missing
            else f"{size:,}-byte batch: {note}",
        )

    async def stored(self) -> None:
        if self.cfg.api is None:
            self.skip(
                ["events.stored"], "no --api: the kit cannot read the store (receipts were only checked on the wire)"
            )
            return
        try:
            rows = await self.cfg.api.events(self.cfg.instance, self.first_seq)
        except ApiError as exc:
            self.say("events.stored", False, str(exc))
            return
        by_id: dict[str, int] = {}
        for row in rows:
            by_id[str(row.get("event_id"))] = by_id.get(str(row.get("event_id")), 0) + 1
        unreadable = [i for i in self.accepted if i not in by_id]
        twice = [i for i in self.accepted if by_id.get(i, 0) > 1]
        ok = not unreadable and not twice
        self.say(
            "events.stored",
            ok,
            f"all {len(self.accepted)} receipted events readable from the API, each once"
            if ok
            else f"receipted but not readable: {unreadable[:3]}; stored twice: {twice[:3]}",
        )

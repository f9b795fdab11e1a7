"""The budgets of §6.7: what has been spent and what is reserved against them (no I/O).

Check and act are one step (PROTOCOL §9): a model request is admitted and its worst case reserved in
one synchronous call (`admit`), before anything is forwarded, so a burst of parallel requests sees
each other's reservations. A request is admitted while the spent figure plus every open reservation is
below each limit; the request that crosses a limit is still served (its cost is known only after), so
a budget is overshot by at most one request, however many are sent at once. The reservation is
settled from the usage the answer reports (`settle`) or released when nothing was spent (`release`).

Attribution: a request belongs to the run the proxy names (the run active when it was admitted, or
the ended run whose process sent it; None: outside a run).
Once that run has ended (`close_run`, when its terminal is chosen), what the request still spends is
charged to the session only: a run's usage is fixed at its terminal and equals the sum of the
`model.usage` events charged to it.

Spent figures are kept per run and for the session. The session is the `state_dir`, not the driver
process: the kernel journals `snapshot()` as requests settle and a new driver process starts its ledger
from it (`restore`), so a crash never resets a session's budget (PROTOCOL §8.2). The runs still open are
in the snapshot too: a run continued after a reattach keeps what it had spent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from driver.protocol.boot import Budget


@dataclass(frozen=True, slots=True)
class Exceeded:
    """Which limit was reached: `limit` names the budget field, `spent` and `allowed` its figures.
    `reserved`: reached only with the open reservations of requests in flight (retry shortly)."""

    limit: str
    spent: float
    allowed: float
    reserved: bool = False

    @property
    def message(self) -> str:
        unit = "tokens" if self.limit == "max_tokens_per_run" else "USD"
        if self.reserved:
            return (
                f"budget.reserved: {self.limit} is {self.allowed:g} {unit}; requests in flight may use what is "
                "left, retry when they end"
            )
        return f"budget.exceeded: {self.limit} is {self.allowed:g} {unit}, {self.spent:g} {unit} spent"

    def details(self) -> dict[str, float | str]:
        return {"limit": self.limit, "spent": self.spent, "allowed": self.allowed}


@dataclass(slots=True)
class Spent:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, input_tokens: int, output_tokens: int, cached_input_tokens: int, cost_usd: float) -> None:
        self.requests += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cached_input_tokens += cached_input_tokens
        self.cost_usd += cost_usd

    @classmethod
    def of(cls, raw: Any) -> Spent | None:
        """A journaled figure read back; None when it is not one (never a negative or a wrong type)."""
        if not isinstance(raw, dict):
            return None
        ints = ("requests", "input_tokens", "output_tokens", "cached_input_tokens")
        values: list[int] = []
        for name in ints:
            value = raw.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return None
            values.append(value)
        cost = raw.get("cost_usd")
        if not isinstance(cost, int | float) or isinstance(cost, bool) or not cost >= 0:
            return None
        return cls(values[0], values[1], values[2], values[3], float(cost))

    def as_usage(self) -> dict[str, int | float | None]:
        """The run's `usage` (run.completed) in the driver's usual fields."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cost_usd": round(self.cost_usd, 8) if self.requests else None,
            "model_requests": self.requests,
        }


@dataclass(slots=True)
class Held:
    tokens: int = 0
    usd: float = 0.0


@dataclass(slots=True)
class Ticket:
    """One admitted request's reservation."""

    run_id: str | None
    tokens: int
    usd: float
    open: bool = True


@dataclass(slots=True)
class Ledger:
    budget: Budget
    session: Spent = field(default_factory=Spent)
    runs: dict[str, Spent] = field(default_factory=dict)
    held_session: Held = field(default_factory=Held)
    held_runs: dict[str, Held] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)

    def run(self, run_id: str) -> Spent:
        return self.runs.setdefault(run_id, Spent())

    def exceeded(self, run_id: str | None, *, with_reserved: bool = False) -> Exceeded | None:
        """The first budget already used by a request of `run_id` (None: outside any run); with
        `with_reserved`, counting the reservations of the requests in flight."""
        b = self.budget
        s = self.session
        hs = self.held_session if with_reserved else Held()
        if b.max_usd_per_session is not None:
            if s.cost_usd >= b.max_usd_per_session:
                return Exceeded("max_usd_per_session", round(s.cost_usd, 6), b.max_usd_per_session)
            if s.cost_usd + hs.usd >= b.max_usd_per_session:
                return Exceeded("max_usd_per_session", round(s.cost_usd, 6), b.max_usd_per_session, reserved=True)
        if run_id is None or run_id in self.closed:
            return None
        r = self.runs.get(run_id, Spent())
        hr = self.held_runs.get(run_id, Held()) if with_reserved else Held()
        if b.max_usd_per_run is not None:
            if r.cost_usd >= b.max_usd_per_run:
                return Exceeded("max_usd_per_run", round(r.cost_usd, 6), b.max_usd_per_run)
            if r.cost_usd + hr.usd >= b.max_usd_per_run:
                return Exceeded("max_usd_per_run", round(r.cost_usd, 6), b.max_usd_per_run, reserved=True)
        tokens = r.input_tokens + r.output_tokens
        if b.max_tokens_per_run is not None:
            if tokens >= b.max_tokens_per_run:
                return Exceeded("max_tokens_per_run", tokens, b.max_tokens_per_run)
            if tokens + hr.tokens >= b.max_tokens_per_run:
                return Exceeded("max_tokens_per_run", tokens, b.max_tokens_per_run, reserved=True)
        return None

    def after_end(self, run_id: str) -> Exceeded | None:
        """A request of a process started during `run_id`, which has ended (§6.7 attribution): it is
        the session's to pay, and refused outright while a per-run budget is set (the run it belongs
        to is over, so nothing more may be spent for it; else backgrounding a loop would outrun every
        per-run budget)."""
        b = self.budget
        r = self.runs.get(run_id, Spent())
        if b.max_usd_per_run is not None:
            return Exceeded("max_usd_per_run", round(r.cost_usd, 6), b.max_usd_per_run)
        if b.max_tokens_per_run is not None:
            return Exceeded("max_tokens_per_run", r.input_tokens + r.output_tokens, b.max_tokens_per_run)
        return None

    def admit(self, run_id: str | None, tokens: int, usd: float) -> Ticket | Exceeded:
        """Check every limit (reservations included) and reserve this request's worst case: one step.
        A run that has ended is only named (the ticket's `run_id`, for the payload): its request is
        checked, held and charged as the session's."""
        open_run = None if run_id in self.closed else run_id
        exceeded = self.exceeded(open_run, with_reserved=True)
        if exceeded is not None:
            return exceeded
        self.held_session.tokens += tokens
        self.held_session.usd += usd
        if open_run is not None:
            held = self.held_runs.setdefault(open_run, Held())
            held.tokens += tokens
            held.usd += usd
        return Ticket(run_id, tokens, usd)

    def release(self, ticket: Ticket) -> None:
        if not ticket.open:
            return
        ticket.open = False
        self.held_session.tokens -= ticket.tokens
        self.held_session.usd -= ticket.usd
        held = self.held_runs.get(ticket.run_id) if ticket.run_id is not None else None
        if held is not None:
            held.tokens -= ticket.tokens
            held.usd -= ticket.usd

    def settle(self, ticket: Ticket, input_tokens: int, output_tokens: int, cached: int, cost_usd: float) -> bool:
        """Charge what the request spent and free its reservation. True when charged to its run (still
        open), False when to the session only (no run, or its run has ended)."""
        self.release(ticket)
        self.session.add(input_tokens, output_tokens, cached, cost_usd)
        if ticket.run_id is None or ticket.run_id in self.closed:
            return False
        self.run(ticket.run_id).add(input_tokens, output_tokens, cached, cost_usd)
        return True

    def close_run(self, run_id: str) -> dict[str, int | float | None]:
        """The run's terminal is being chosen: its usage is fixed now, later spending is the session's."""
        self.closed.add(run_id)
        self.held_runs.pop(run_id, None)
        return self.run(run_id).as_usage()

    def snapshot(self) -> dict[str, Any]:
        """What a new driver process starts from: the session's figures and each open run's."""
        runs = {r: asdict(s) for r, s in self.runs.items() if r not in self.closed and s.requests}
        return {"session": asdict(self.session), "runs": runs}

    def restore(self, raw: Any) -> bool:
        """Start from a snapshot (a predecessor's); False, and nothing taken, when it is not one."""
        if not isinstance(raw, dict) or not isinstance(raw.get("runs", {}), dict):
            return False
        session = Spent.of(raw.get("session"))
        runs = {r: Spent.of(v) for r, v in raw.get("runs", {}).items()}
        if session is None or any(v is None for v in runs.values()):
            return False
        self.session = session
        self.runs.update({r: v for r, v in runs.items() if v is not None})
        return True

    def forget(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

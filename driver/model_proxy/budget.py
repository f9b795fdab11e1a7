"""The budgets of §6.7 and what has been spent against them (no I/O).

Spent figures are kept per run and for the session (the driver process; a new process starts the
session's figure again from zero unless the control plane gives a smaller budget: the CP holds the
history). A budget is "used" once the spent figure reaches it, so the request that crosses a limit
is served and the next one is refused: the proxy cannot know a request's cost before the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from driver.protocol.boot import Budget


@dataclass(frozen=True, slots=True)
class Exceeded:
    """Which limit was reached: `limit` names the budget field, `spent` and `allowed` its figures."""

    limit: str
    spent: float
    allowed: float

    @property
    def message(self) -> str:
        unit = "tokens" if self.limit == "max_tokens_per_run" else "USD"
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
    unpriced_requests: int = 0  # requests whose model had no known price

    def add(self, input_tokens: int, output_tokens: int, cached_input_tokens: int, cost_usd: float | None) -> None:
        self.requests += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cached_input_tokens += cached_input_tokens
        if cost_usd is None:
            self.unpriced_requests += 1
        else:
            self.cost_usd += cost_usd

    def as_usage(self) -> dict[str, int | float | None]:
        """The run's `usage` (run.completed) in the driver's usual fields."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cost_usd": round(self.cost_usd, 8) if self.requests > self.unpriced_requests else None,
            "model_requests": self.requests,
        }


@dataclass(slots=True)
class Ledger:
    budget: Budget
    session: Spent = field(default_factory=Spent)
    runs: dict[str, Spent] = field(default_factory=dict)

    def run(self, run_id: str) -> Spent:
        return self.runs.setdefault(run_id, Spent())

    def record(
        self, run_id: str | None, input_tokens: int, output_tokens: int, cached: int, cost_usd: float | None
    ) -> None:
        self.session.add(input_tokens, output_tokens, cached, cost_usd)
        if run_id is not None:
            self.run(run_id).add(input_tokens, output_tokens, cached, cost_usd)

    def exceeded(self, run_id: str | None) -> Exceeded | None:
        """The first budget already used, for a request of `run_id` (None: outside any run)."""
        b = self.budget
        s = self.session
        if b.max_usd_per_session is not None and s.cost_usd >= b.max_usd_per_session:
            return Exceeded("max_usd_per_session", round(s.cost_usd, 6), b.max_usd_per_session)
        if run_id is None:
            return None
        r = self.runs.get(run_id, Spent())
        if b.max_usd_per_run is not None and r.cost_usd >= b.max_usd_per_run:
            return Exceeded("max_usd_per_run", round(r.cost_usd, 6), b.max_usd_per_run)
        tokens = r.input_tokens + r.output_tokens
        if b.max_tokens_per_run is not None and tokens >= b.max_tokens_per_run:
            return Exceeded("max_tokens_per_run", tokens, b.max_tokens_per_run)
        return None

    def forget(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

"""What a model request costs: a small table of list prices in USD per million tokens (no I/O).

Prices are the vendors' published list prices for standard (non-batch) use, as of the table's date;
a model not in the table has no known price and its `cost_usd` is null (budgets in USD then do not
count it, `max_tokens_per_run` still does). The longest matching prefix wins, so a dated model name
(`claude-sonnet-4-5-20250929`) finds its family's row.

Cached input is priced at the row's `cached` rate; Anthropic's cache writes at 1.25 x input (the
5-minute cache), which the `cache_write` column holds.
"""

from __future__ import annotations

from dataclasses import dataclass

TABLE_DATE = "2026-11"


@dataclass(frozen=True, slots=True)
class Price:
    input: float  # USD per million uncached input tokens
    output: float  # USD per million output tokens
    cached: float  # USD per million cached input tokens (cache reads)
    cache_write: float | None = None  # USD per million cache-write tokens (Anthropic), else input


PRICES: dict[str, Price] = {
    # Anthropic
    "claude-opus-4-1": Price(15.0, 75.0, 1.5, 18.75),
    "claude-opus-4": Price(15.0, 75.0, 1.5, 18.75),
    "claude-opus-4-5": Price(5.0, 25.0, 0.5, 6.25),
    "claude-sonnet-4": Price(3.0, 15.0, 0.3, 3.75),
    "claude-haiku-4": Price(1.0, 5.0, 0.1, 1.25),
    "claude-3-5-haiku": Price(0.8, 4.0, 0.08, 1.0),
    # OpenAI
    "gpt-5": Price(1.25, 10.0, 0.125),
    "gpt-5-mini": Price(0.25, 2.0, 0.025),
    "gpt-5-nano": Price(0.05, 0.4, 0.005),
    "gpt-4.1": Price(2.0, 8.0, 0.5),
    "gpt-4.1-mini": Price(0.4, 1.6, 0.1),
    "gpt-4o": Price(2.5, 10.0, 1.25),
    "gpt-4o-mini": Price(0.15, 0.6, 0.075),
    "o3": Price(2.0, 8.0, 0.5),
    "o4-mini": Price(1.1, 4.4, 0.275),
}


# The rates an unpriced model is charged at: each column's highest.
HIGHEST = Price(
    max(p.input for p in PRICES.values()),
    max(p.output for p in PRICES.values()),
    max(p.cached for p in PRICES.values()),
    max(p.cache_write if p.cache_write is not None else p.input for p in PRICES.values()),
)


def price_of(model: str, table: dict[str, Price] | None = None) -> Price | None:
    """The row for `model`: exact name, else the longest prefix followed by '-' or '.'."""
    rows = PRICES if table is None else table
    name = model.strip().lower()
    if name in rows:
        return rows[name]
    best: str | None = None
    for prefix in rows:
        if (
            name.startswith(prefix)
            and name[len(prefix) : len(prefix) + 1] in ("-", ".", "")
            and (best is None or len(prefix) > len(best))
        ):
            best = prefix
    return rows[best] if best is not None else None


def cost_usd(
    model: str,
    *,
    input_tokens: int,
    output_tokens: int,
    cached_input_tokens: int = 0,
    cache_write_tokens: int = 0,
    table: dict[str, Price] | None = None,
) -> float | None:
    """The request's cost, or None when the model's price is unknown. `input_tokens` is the whole
    input, cached and cache-written tokens included (they are priced at their own rates)."""
    price = price_of(model, table)
    if price is None:
        return None
    cached = min(max(cached_input_tokens, 0), max(input_tokens, 0))
    written = min(max(cache_write_tokens, 0), max(input_tokens - cached, 0))
    plain = max(input_tokens - cached - written, 0)
    write_rate = price.input if price.cache_write is None else price.cache_write
    total = plain * price.input + cached * price.cached + written * write_rate + max(output_tokens, 0) * price.output
    return round(total / 1_000_000, 8)


def charge_usd(
    model: str, *, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0, cache_write_tokens: int = 0
) -> tuple[float, bool]:
    """What a request is charged: (USD, priced). An unknown model is charged at `HIGHEST` (priced False)."""
    priced = price_of(model) is not None
    cost = cost_usd(
        model if priced else "highest",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached_input_tokens,
        cache_write_tokens=cache_write_tokens,
        table=None if priced else {"highest": HIGHEST},
    )
    assert cost is not None
    return cost, priced

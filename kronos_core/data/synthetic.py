"""Deterministic synthetic K-lines for tests, demos and smoke-training.

Prices follow a geometric Brownian motion on A-share trading sessions
(weekdays, 09:30-11:30 and 13:00-15:00; no holiday calendar). Each bar is
stamped at its close time, so 5-minute bars run 09:35 ... 11:30, 13:05 ... 15:00.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from kronos_core.data.kline import FEATURE_COLUMNS, PRICE_COLUMNS, TIME_COLUMN
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

# (open, close) of each session as minutes after midnight.
SESSIONS: tuple[tuple[int, int], ...] = ((9 * 60 + 30, 11 * 60 + 30), (13 * 60, 15 * 60))


def session_bar_minutes(freq_minutes: int) -> np.ndarray:
    """Close times (minutes after midnight) of one trading day's bars."""
    if freq_minutes < 1 or any((end - start) % freq_minutes for start, end in SESSIONS):
        raise KronosError(
            f"synthetic data: freq_minutes={freq_minutes} does not divide the 120-minute sessions; "
            "use e.g. 1, 5, 15, 30 or 60"
        )
    return np.concatenate(
        [np.arange(start + freq_minutes, end + 1, freq_minutes) for start, end in SESSIONS]
    )


def trading_timestamps(n_rows: int, start: str | pd.Timestamp, freq_minutes: int) -> pd.DatetimeIndex:
    """The first ``n_rows`` bar close times whose bar opens at or after ``start``."""
    bar_close = session_bar_minutes(freq_minutes)
    start_ts = pd.Timestamp(start)
    first_day = start_ts.normalize()
    # Enough weekdays for n_rows bars even if the start day contributes none.
    n_days = n_rows // len(bar_close) + 2
    days = pd.bdate_range(first_day, periods=n_days)
    stamps = (
        days.to_numpy()[:, None] + (bar_close.astype("timedelta64[m]"))[None, :]
    ).ravel()
    opens = stamps - np.timedelta64(freq_minutes, "m")
    stamps = stamps[opens >= start_ts.to_datetime64()][:n_rows]
    return pd.DatetimeIndex(stamps, name=TIME_COLUMN)


def synthetic_kline(
    n_rows: int = 2000,
    seed: int = 0,
    start: str | pd.Timestamp = "2024-01-02 09:30",
    freq_minutes: int = 5,
    start_price: float = 10.0,
    drift: float = 0.0,
    volatility: float = 0.02,
    base_volume: float = 50_000.0,
    overnight_volatility: float | None = None,
) -> pd.DataFrame:
    """One deterministic OHLCV series; the same arguments give the same frame.

    ``drift`` and ``volatility`` are the mean and std of the log return per
    trading day, spread evenly over its bars; ``overnight_volatility`` is the
    std of the log gap between a day's close and the next open (default half
    the daily volatility), on top of the daily moves. Volume is lognormal
    around ``base_volume`` shares per bar, higher near session open and close;
    amount = volume * mean(open, high, low, close). OHLC is always consistent
    and the frame passes ``validate_kline`` without warnings.
    """
    if n_rows < 1:
        raise KronosError(f"synthetic data: n_rows={n_rows}; ask for at least 1 row")
    if start_price <= 0 or volatility < 0 or base_volume <= 0:
        raise KronosError(
            "synthetic data: start_price and base_volume must be > 0 and volatility >= 0; fix the arguments"
        )
    bars_per_day = len(session_bar_minutes(freq_minutes))
    stamps = trading_timestamps(n_rows, start, freq_minutes)
    rng = np.random.default_rng(seed)

    sigma = volatility / np.sqrt(bars_per_day)
    mu = drift / bars_per_day
    gap_sigma = 0.5 * volatility if overnight_volatility is None else overnight_volatility

    minute_of_day = stamps.hour.to_numpy() * 60 + stamps.minute.to_numpy()
    first_bar_minute = SESSIONS[0][0] + freq_minutes
    day_start = minute_of_day == first_bar_minute
    day_start[0] = False  # the series opens at start_price

    # Open of each bar = previous close, plus an overnight gap on a day's first bar.
    log_ret = mu + sigma * rng.standard_normal(n_rows)
    log_gap = np.where(day_start, gap_sigma * rng.standard_normal(n_rows), 0.0)
    log_close = np.log(start_price) + np.cumsum(log_gap + log_ret)
    log_open = log_close - log_ret
    open_ = np.exp(log_open)
    close = np.exp(log_close)
    # Wicks beyond the body, about half a bar's std each side.
    upper = np.abs(rng.standard_normal(n_rows)) * 0.5 * sigma
    lower = np.abs(rng.standard_normal(n_rows)) * 0.5 * sigma
    high = np.maximum(open_, close) * np.exp(upper)
    low = np.minimum(open_, close) * np.exp(-lower)

    # U-shaped intraday volume: busiest right after each open and before each close.
    session_pos = np.zeros(n_rows)
    for s_open, s_close in SESSIONS:
        inside = (minute_of_day > s_open) & (minute_of_day <= s_close)
        session_pos[inside] = (minute_of_day[inside] - s_open) / (s_close - s_open)
    u_shape = 1.0 + 1.5 * (2.0 * session_pos - 1.0) ** 2
    volume = np.round(base_volume * u_shape * rng.lognormal(0.0, 0.5, n_rows)) + 100.0
    typical = (open_ + high + low + close) / 4.0
    amount = volume * typical

    data = {TIME_COLUMN: stamps.to_numpy()}
    data.update(zip(PRICE_COLUMNS, (open_, high, low, close)))
    data.update(volume=volume, amount=amount)
    return pd.DataFrame(data, columns=[TIME_COLUMN, *FEATURE_COLUMNS])


def synthetic_series(
    n_series: int, n_rows: int = 2000, seed: int = 0, **kwargs: object
) -> list[pd.DataFrame]:
    """``n_series`` independent series, each with its own seed and start price.

    Seeds and start prices (lognormal around 10, roughly 2-50) are derived
    from ``seed`` so the whole list is reproducible. Extra keyword arguments
    go to :func:`synthetic_kline` (``start_price`` there is ignored).
    """
    if n_series < 1:
        raise KronosError(f"synthetic data: n_series={n_series}; ask for at least 1 series")
    kwargs.pop("start_price", None)
    children = np.random.SeedSequence(seed).spawn(n_series)
    frames = []
    for child in children:
        child_seed = int(child.generate_state(1)[0])
        price = float(np.exp(np.log(10.0) + 0.8 * np.random.default_rng(child).standard_normal()))
        frames.append(synthetic_kline(n_rows=n_rows, seed=child_seed, start_price=round(price, 2), **kwargs))
    return frames


def _ohlcv_from_log_returns(
    log_ret: np.ndarray, stamps: pd.DatetimeIndex, rng: np.random.Generator, start_price: float,
    bar_sigma: float, base_volume: float,
) -> dict[str, np.ndarray]:
    """OHLCV columns for one symbol whose close-to-close log returns are given (open = previous close)."""
    n_rows = len(log_ret)
    log_close = np.log(start_price) + np.cumsum(log_ret)
    close = np.exp(log_close)
    open_ = np.exp(log_close - log_ret)
    high = np.maximum(open_, close) * np.exp(np.abs(rng.standard_normal(n_rows)) * 0.5 * bar_sigma)
    low = np.minimum(open_, close) * np.exp(-np.abs(rng.standard_normal(n_rows)) * 0.5 * bar_sigma)
    minute_of_day = stamps.hour.to_numpy() * 60 + stamps.minute.to_numpy()
    session_pos = np.zeros(n_rows)
    for s_open, s_close in SESSIONS:
        inside = (minute_of_day > s_open) & (minute_of_day <= s_close)
        session_pos[inside] = (minute_of_day[inside] - s_open) / (s_close - s_open)
    u_shape = 1.0 + 1.5 * (2.0 * session_pos - 1.0) ** 2
    volume = np.round(base_volume * u_shape * rng.lognormal(0.0, 0.5, n_rows)) + 100.0
    amount = volume * (open_ + high + low + close) / 4.0
    return dict(open=open_, high=high, low=low, close=close, volume=volume, amount=amount)


def synthetic_universe_symbols(
    n_symbols: int,
    n_rows: int = 2000,
    seed: int = 0,
    n_sectors: int | None = None,
    start: str | pd.Timestamp = "2024-01-02 09:30",
    freq_minutes: int = 5,
    market_volatility: float = 0.012,
    sector_volatility: float = 0.008,
    idio_volatility: float = 0.015,
    trend_strength: float = 0.25,
    trend_half_life_days: float = 2.0,
) -> Iterator[tuple[str, str, pd.DatetimeIndex, dict[str, np.ndarray]]]:
    """A synthetic universe of ``n_symbols`` stocks on shared A-share bars, one symbol at a time: (symbol,
    sector, bar stamps, OHLCV columns).

    SYNTHETIC DATA, not market data. Each bar's log return of symbol i in
    sector s is ``beta_i * market + sector_s + idio_i``: a market factor all
    symbols share (betas around 1), a factor per sector, and noise of its own
    (volatilities are per trading day, spread over its bars like
    :func:`synthetic_kline`). Each sector factor also carries a slowly
    changing drift (an AR(1) with the given half-life whose std is
    ``trend_strength`` x the sector's per-bar volatility), so a sector that
    has been rising tends to keep rising for a while: rankings of future
    returns are partly predictable from the past instead of pure noise.

    Symbols ``SYN0000``... in order; every symbol's bars pass
    ``validate_kline``. The same arguments give the same numbers.
    """
    if n_symbols < 1:
        raise KronosError(f"synthetic universe: n_symbols={n_symbols}; ask for at least 1 symbol")
    if n_rows < 1:
        raise KronosError(f"synthetic universe: n_rows={n_rows}; ask for at least 1 row")
    if min(market_volatility, sector_volatility, idio_volatility, trend_strength) < 0 or trend_half_life_days <= 0:
        raise KronosError("synthetic universe: volatilities and trend_strength must be >= 0 and "
                          "trend_half_life_days > 0; fix the arguments")
    sectors = n_sectors if n_sectors is not None else max(1, min(10, n_symbols // 20))
    if sectors < 1:
        raise KronosError(f"synthetic universe: n_sectors={sectors}; ask for at least 1 sector")
    bars_per_day = len(session_bar_minutes(freq_minutes))
    stamps = trading_timestamps(n_rows, start, freq_minutes)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 20240102]))
    per_bar = 1.0 / np.sqrt(bars_per_day)

    market = market_volatility * per_bar * rng.standard_normal(n_rows)
    sector_sigma = sector_volatility * per_bar
    phi = 0.5 ** (1.0 / (trend_half_life_days * bars_per_day))
    shocks = trend_strength * sector_sigma * np.sqrt(1.0 - phi**2) * rng.standard_normal((sectors, n_rows))
    drift = np.zeros((sectors, n_rows))
    drift[:, 0] = trend_strength * sector_sigma * rng.standard_normal(sectors)
    for t in range(1, n_rows):
        drift[:, t] = phi * drift[:, t - 1] + shocks[:, t]
    sector_returns = drift + sector_sigma * rng.standard_normal((sectors, n_rows))

    membership = rng.integers(0, sectors, n_symbols)
    betas = np.clip(1.0 + 0.3 * rng.standard_normal(n_symbols), 0.2, 2.0)
    prices = np.round(np.exp(np.log(10.0) + 0.8 * rng.standard_normal(n_symbols)), 2).clip(0.5)
    volumes = 50_000.0 * rng.lognormal(0.0, 0.7, n_symbols)
    bar_sigma = float(np.sqrt(market_volatility**2 + sector_volatility**2 + idio_volatility**2) * per_bar)

    for i in range(n_symbols):
        own = rng.standard_normal(n_rows) * idio_volatility * per_bar
        log_ret = betas[i] * market + sector_returns[membership[i]] + own
        log_ret[0] = 0.0  # the first bar opens and closes near the start price
        columns = _ohlcv_from_log_returns(log_ret, stamps, rng, float(prices[i]), bar_sigma, float(volumes[i]))
        yield f"SYN{i:04d}", f"sector{membership[i]:02d}", stamps, columns

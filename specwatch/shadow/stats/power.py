"""Sample size for a paired (McNemar) comparison: how many questions detect a given net loss."""

from __future__ import annotations

import math

from scipy.special import ndtri  # what scipy.stats.norm.ppf evaluates, without its import


def z_quantile(p: float, decimals: int | None = 4) -> float:
    """Standard normal quantile Φ⁻¹(p), rounded to ``decimals`` like a printed z table.

    With the default 4 decimals, p = 0.975 gives 1.96 and p = 0.8 gives 0.8416, the values
    the seed's ``questions_needed`` uses. ``decimals=None`` keeps full precision.
    """
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    z = float(ndtri(p))
    return z if decimals is None else round(z, decimals)


def questions_needed_z(net_loss: float, discordant: float, z_alpha: float, z_beta: float) -> int:
    """Connor's sample-size formula for McNemar's test, given the two z values.

    Source: Connor R.J. (1987), "Sample size for testing differences in proportions for the
    paired-sample design", Biometrics 43:207-211 (the seed's ``questions_needed``):
    ``n = ceil((z_α sqrt(ψ) + z_β sqrt(ψ - δ²))² / δ²)`` with δ = net loss and ψ = discordant
    rate (share of questions that flip either way; must satisfy δ <= ψ <= 1).
    Raises ValueError outside that range, and when δ is so small that n is not a finite float.
    """
    if not 0.0 < abs(net_loss) <= discordant <= 1.0:
        raise ValueError("need 0 < |net_loss| <= discordant <= 1")
    d2 = net_loss * net_loss
    root = z_alpha * math.sqrt(discordant) + z_beta * math.sqrt(discordant - d2)
    n = root * root / d2 if d2 > 0.0 else math.inf
    if not math.isfinite(n):  # δ² underflows to 0 (|δ| < ~1e-162) or n overflows a float
        raise ValueError(f"net_loss {net_loss!r} is too small: no finite sample size detects it")
    # Guard against a ceil landing one above an exact integer through float noise.
    return math.ceil(n - 1e-9)


def questions_needed(
    net_loss: float,
    discordant: float,
    alpha: float = 0.05,
    power: float = 0.8,
    two_sided: bool = True,
    z_decimals: int | None = 4,
) -> int:
    """Paired questions needed to detect ``net_loss`` at ``discordant`` flip rate.

    Connor (1987), Biometrics 43:207-211, with ``z_α = Φ⁻¹(1 - α/2)`` (two-sided, the seed's
    default) or ``Φ⁻¹(1 - α)`` (one-sided) and ``z_β = Φ⁻¹(power)``, each rounded to
    ``z_decimals`` (4, as in printed tables and the seed: 1.96 and 0.8416). Examples (α = 0.05,
    power 0.8): net loss 0.02 at 6% discordance -> 1,175; 0.01 at 6% -> 4,708; 0.02 at 8% ->
    1,568. With unrounded quantiles (``z_decimals=None``) the middle one is 4,707.
    """
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError("alpha and power must be in (0, 1)")
    z_a = z_quantile(1.0 - alpha / 2.0 if two_sided else 1.0 - alpha, z_decimals)
    z_b = z_quantile(power, z_decimals)
    return questions_needed_z(net_loss, discordant, z_a, z_b)


def pairs_to_decide(
    net_loss: float,
    discordant: float,
    n: int,
    margin: float,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int | None:
    """ "About N more pairs": the labelled pairs still needed, **under the observed effect**, for
    one of the two one-sided questions to be decided, the one that needs fewer.

    With the observed net loss ``L̂`` (``(lost - gained) / n``) and discordance ``ψ̂``
    (``(lost + gained) / n``) after ``n`` labelled pairs: a loss
    ``L̂ > 0`` is shown after Connor's n for δ = L̂ (one-sided ``alpha``, ``power``); "within
    ``margin``" is shown after Connor's n for δ = ``margin - L̂`` when that is positive. Each
    at ``ψ = min(1, max(ψ̂, δ))`` (Connor needs δ <= ψ). Returns ``max(0, needed - n)``, or
    ``None`` without labelled pairs or when neither question applies (L̂ <= 0 with no margin).
    The one function behind every "about N more pairs" (the verdict sentence and the decision
    table). ``None`` too for a NaN rate.
    """
    if n <= 0 or not math.isfinite(net_loss) or not math.isfinite(discordant):
        return None
    est, disc = net_loss, discordant
    needed: list[int] = []
    for delta in (est, margin - est if margin > 0.0 else 0.0):
        if delta > 1e-12:
            psi = min(1.0, max(disc, delta))
            needed.append(
                questions_needed(min(delta, psi), psi, alpha=alpha, power=power, two_sided=False)
            )
    return max(0, min(needed) - n) if needed else None

"""Synthetic target and draft language models and the speculative-decoding verification rules.

Vocabulary (``vocab_size`` V, default 128): id 0 is EOS (empty text), ids 1-10 are the digits
``"0"``-``"9"``, id 11 is the marker ``" answer: "``, id 12 is ``" ."``, the rest are filler words.

Every generation follows a small grammar driven by the context: *reason* (filler words) until the
per-request reasoning length R is reached, then the marker, then the answer digits, then a *tail* of
filler words ending in EOS (after EOS, a new paragraph starts). The target's next-token
distribution is a deterministic function of the context (prompt hash, the two previous tokens and
the position, hashed into fixed random tables) with a tunable entropy profile; the draft model is
the target's logits plus hashed noise (``draft_noise``: larger means less agreement) and, at answer
digits, a per-request *distractor* digit (``draft_confusion``).

Randomness is counter based: every uniform is a hash of (request seed, output position, slot), so
a request's tokens do not depend on what else is in the batch, and two servers given the same seed
draw the same uniforms (paired arms differ only where their rules differ).

Verification (:func:`verify`) implements, vectorised over the batch:

* standard rejection sampling (Leviathan et al., arXiv 2211.17192; vLLM
  ``vllm/v1/sample/rejection_sampler.py``): accept draft x when ``p(x) >= u * q(x)``; at the first
  rejection emit a recovered token from ``normalize(max(p - q, 0))``; a bonus token from the target
  when all drafts pass; greedy requests accept iff the draft is the target's argmax.
* FLy as vLLM 0.33 implements it (``vllm/v1/spec_decode/fly.py``): a native rejection at i is
  waived iff the token is valid with p(x) > 0 (and q(x) > 0 for random requests), ``i + W < K_d``,
  the top-k entropy of the target probabilities (not renormalised, nats) is ``>= threshold`` and
  the next W drafts are natively accepted. Several waivers per draft are possible.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
B8 = npt.NDArray[np.bool_]

EOS = 0
DIGIT0 = 1
MARKER = 11
PERIOD = 12
FIRST_FILLER = 13
MAX_ANSWER_DIGITS = 4

PHASE_REASON = 0
PHASE_ANSWER = 1
PHASE_TAIL = 2

# uniform slots (counter-based RNG)
SLOT_DRAFT = 1
SLOT_ACCEPT = 2
SLOT_EMIT = 3

_WORDS = [
    "the",
    "model",
    "reads",
    "the",
    "question",
    "and",
    "works",
    "through",
    "each",
    "step",
    "with",
    "care",
    "so",
    "that",
    "the",
    "result",
    "is",
    "checked",
    "twice",
    "before",
    "it",
    "writes",
    "a",
    "short",
    "note",
    "about",
    "why",
    "this",
    "value",
    "fits",
    "all",
    "of",
    "facts",
    "given",
    "here",
    "while",
    "other",
    "options",
    "look",
    "less",
    "likely",
    "given",
    "what",
    "we",
    "know",
    "from",
    "earlier",
    "lines",
    "then",
    "it",
    "adds",
    "numbers",
    "counts",
    "items",
    "compares",
    "sizes",
    "recalls",
    "names",
    "dates",
    "places",
    "units",
    "rules",
    "first",
    "second",
    "third",
    "next",
    "last",
    "again",
    "also",
    "because",
    "however",
    "therefore",
    "thus",
    "maybe",
    "surely",
    "data",
    "value",
    "sum",
    "total",
    "part",
    "whole",
    "half",
    "pair",
    "group",
    "set",
    "list",
    "table",
    "row",
    "column",
    "key",
    "word",
    "text",
    "code",
    "test",
    "run",
    "loop",
    "call",
    "map",
    "tree",
    "node",
    "edge",
    "path",
    "cost",
    "rate",
    "time",
    "day",
    "week",
    "year",
    "city",
    "river",
    "red",
    "blue",
    "green",
    "small",
    "large",
    "quick",
    "slow",
]


def vocabulary(vocab_size: int) -> list[str]:
    """Text of each token id (``vocab_size`` >= 32). Raises ``ValueError`` when too small."""
    if vocab_size < 32:
        raise ValueError("vocab_size must be >= 32")
    pieces = ["", *[str(d) for d in range(10)], " answer: ", " ."]
    i = 0
    while len(pieces) < vocab_size:
        word = _WORDS[i % len(_WORDS)]
        suffix = "" if i < len(_WORDS) else str(i // len(_WORDS))
        pieces.append(" " + word + suffix)
        i += 1
    return pieces


_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)


def mix64(x: U64) -> U64:
    """splitmix64 finaliser, elementwise on uint64 arrays (wrapping arithmetic)."""
    z = x + _M1
    z = (z ^ (z >> _S30)) * _M2
    z = (z ^ (z >> _S27)) * _M3
    return np.asarray(z ^ (z >> _S31), dtype=np.uint64)


def counter_uniforms(seed: U64, pos: I64, slot: int) -> F64:
    """Uniforms in [0, 1) from (seed, position, slot); ``seed`` broadcasts against ``pos``."""
    key = mix64(
        np.asarray(seed, dtype=np.uint64)
        ^ mix64(pos.astype(np.uint64) * np.uint64(0x100000001B3) + np.uint64(slot))
    )
    return np.asarray((key >> _S11).astype(np.float64) * (2.0**-53), dtype=np.float64)


def _sample_rows(probs: F64, u: F64) -> I64:
    """Inverse-CDF sample of one index per row of ``probs`` (rows need not be normalised)."""
    cdf = np.cumsum(probs, axis=1)
    total = cdf[:, -1:]
    idx = (cdf <= u[:, None] * total).sum(axis=1)
    return np.asarray(np.minimum(idx, probs.shape[1] - 1), dtype=np.int64)


def topk_entropy(probs: F64, k: int) -> F64:
    """FLy's entropy gate: ``-sum_{j in topk(p)} p_j ln p_j`` over the k largest probabilities,
    not renormalised, in nats (vLLM ``vllm/v1/spec_decode/fly.py: compute_fly_entropy``).
    ``probs`` has shape (..., V); returns shape (...)."""
    k = max(1, min(k, probs.shape[-1]))
    top = -np.partition(-probs, k - 1, axis=-1)[..., :k]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(top > 0, -top * np.log(np.where(top > 0, top, 1.0)), 0.0)
    return np.asarray(terms.sum(axis=-1), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class LMConfig:
    """Synthetic LM knobs.

    ``target_sharpness``: scale of the target's filler logits (higher = lower entropy);
    ``sharpness_spread``: log-normal spread of that scale across contexts (the entropy profile);
    ``draft_noise``: std of the hashed noise added to the draft's logits (higher = less agreement);
    ``answer_mass``: gold-digit probability for prompts that are not canary items;
    ``marker_prob``: target probability of the answer marker once the reasoning length is reached.
    """

    vocab_size: int = 128
    seed: int = 0
    table_rows: int = 4096
    target_sharpness: float = 8.0
    sharpness_spread: float = 0.5
    draft_noise: float = 0.8
    answer_mass: float = 0.85
    marker_prob: float = 0.95
    eos_prob: float = 0.9


@dataclass(slots=True)
class SeqParams:
    """Per-request static parameters of the synthetic model (derived from the prompt).

    ``gold``: answer digits the target favours; ``gold_mass``: target probability of each gold
    digit; ``distractor``/``distractor_mass``: the competing digit and its target mass;
    ``draft_confusion``: probability mass the draft moves onto the distractor at answer digits;
    ``reason_len``/``tail_len``: tokens before the marker and after the answer.
    """

    salt: int
    gold: str
    gold_mass: float
    distractor_mass: float
    draft_confusion: float
    reason_len: int
    tail_len: int


class SeqTable:
    """Struct-of-arrays store of every live request's model state, indexed by row."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = 0
        self.salt = np.zeros(0, np.uint64)
        self.seed = np.zeros(0, np.uint64)
        self.gold = np.zeros((0, MAX_ANSWER_DIGITS), np.int64)
        self.distractor = np.zeros((0, MAX_ANSWER_DIGITS), np.int64)
        self.gold_len = np.zeros(0, np.int64)
        self.gold_mass = np.zeros(0, np.float64)
        self.distractor_mass = np.zeros(0, np.float64)
        self.confusion = np.zeros(0, np.float64)
        self.reason_len = np.zeros(0, np.int64)
        self.tail_len = np.zeros(0, np.int64)
        self.temperature = np.zeros(0, np.float64)
        self.top_p = np.zeros(0, np.float64)
        # dynamic state
        self.t = np.zeros(0, np.int64)
        self.phase = np.zeros(0, np.int64)
        self.didx = np.zeros(0, np.int64)
        self.tidx = np.zeros(0, np.int64)
        self.rstart = np.zeros(0, np.int64)
        self.prev1 = np.zeros(0, np.int64)
        self.prev2 = np.zeros(0, np.int64)
        self._free: list[int] = []
        self._grow(capacity)

    _FIELDS = (
        "salt",
        "seed",
        "gold",
        "distractor",
        "gold_len",
        "gold_mass",
        "distractor_mass",
        "confusion",
        "reason_len",
        "tail_len",
        "temperature",
        "top_p",
        "t",
        "phase",
        "didx",
        "tidx",
        "rstart",
        "prev1",
        "prev2",
    )

    def _grow(self, new_capacity: int) -> None:
        for name in self._FIELDS:
            old = getattr(self, name)
            shape = (new_capacity, *old.shape[1:])
            arr = np.zeros(shape, old.dtype)
            arr[: old.shape[0]] = old
            setattr(self, name, arr)
        self._free.extend(range(new_capacity - 1, self.capacity - 1, -1))
        self.capacity = new_capacity

    def allocate(
        self,
        params: SeqParams,
        *,
        seed: int,
        temperature: float,
        top_p: float,
        last_prompt_tokens: tuple[int, int],
    ) -> int:
        """Store a new request; returns its row."""
        if not self._free:
            self._grow(max(16, self.capacity * 2))
        row = self._free.pop()
        digits = [int(c) for c in params.gold[:MAX_ANSWER_DIGITS]]
        self.salt[row] = np.uint64(params.salt & 0xFFFFFFFFFFFFFFFF)
        self.seed[row] = np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
        self.gold[row] = 0
        self.gold[row, : len(digits)] = digits
        self.distractor[row] = [
            (d + 1 + (params.salt >> (4 * i)) % 9) % 10
            for i, d in enumerate(digits + [0] * (MAX_ANSWER_DIGITS - len(digits)))
        ]
        self.gold_len[row] = len(digits)
        self.gold_mass[row] = params.gold_mass
        self.distractor_mass[row] = params.distractor_mass
        self.confusion[row] = params.draft_confusion
        self.reason_len[row] = params.reason_len
        self.tail_len[row] = params.tail_len
        self.temperature[row] = temperature
        self.top_p[row] = top_p
        self.t[row] = 0
        self.phase[row] = PHASE_REASON
        self.didx[row] = 0
        self.tidx[row] = 0
        self.rstart[row] = 0
        self.prev1[row] = last_prompt_tokens[1]
        self.prev2[row] = last_prompt_tokens[0]
        return row

    def release(self, row: int) -> None:
        """Free ``row`` for reuse."""
        self._free.append(row)


@dataclass(slots=True)
class DynState:
    """Dynamic grammar state of a batch of rows (copies; advanced along a draft path)."""

    t: I64
    phase: I64
    didx: I64
    tidx: I64
    rstart: I64
    prev1: I64
    prev2: I64

    @classmethod
    def of(cls, table: SeqTable, rows: I64) -> DynState:
        return cls(
            table.t[rows].copy(),
            table.phase[rows].copy(),
            table.didx[rows].copy(),
            table.tidx[rows].copy(),
            table.rstart[rows].copy(),
            table.prev1[rows].copy(),
            table.prev2[rows].copy(),
        )

    def copy(self) -> DynState:
        return DynState(
            self.t.copy(),
            self.phase.copy(),
            self.didx.copy(),
            self.tidx.copy(),
            self.rstart.copy(),
            self.prev1.copy(),
            self.prev2.copy(),
        )

    def advance(self, tok: I64, gold_len: I64, mask: B8 | None = None) -> None:
        """Feed one token per row (rows where ``mask`` is False are left unchanged)."""
        m = np.ones(tok.shape[0], np.bool_) if mask is None else mask
        in_reason = (self.phase == PHASE_REASON) & m
        in_answer = (self.phase == PHASE_ANSWER) & m
        in_tail = (self.phase == PHASE_TAIL) & m
        to_answer = in_reason & (tok == MARKER)
        didx = np.where(in_answer, self.didx + 1, self.didx)
        answer_done = in_answer & (didx >= gold_len)
        eos_in_tail = in_tail & (tok == EOS)
        phase = self.phase.copy()
        phase[to_answer] = PHASE_ANSWER
        didx[to_answer] = 0
        phase[answer_done] = PHASE_TAIL
        tidx = np.where(in_tail, self.tidx + 1, self.tidx)
        tidx[answer_done] = 0
        phase[eos_in_tail] = PHASE_REASON
        self.rstart = np.where(eos_in_tail, self.t + 1, self.rstart)
        self.phase = phase
        self.didx = didx
        self.tidx = tidx
        self.t = np.where(m, self.t + 1, self.t)
        self.prev2 = np.where(m, self.prev1, self.prev2)
        self.prev1 = np.where(m, tok, self.prev1)


@dataclass(slots=True)
class VerifyResult:
    """Outcome of one verify step for n rows.

    ``accepted[i]``: draft tokens accepted (native or waived); ``tokens[i]``: the emitted tokens
    (accepted drafts then one recovered or bonus token, length ``accepted[i] + 1``);
    ``waived[i]``: FLy waivers that ended up inside the accepted prefix.
    """

    accepted: I64
    tokens: list[list[int]]
    waived: I64
    final_state: DynState


@dataclass(frozen=True, slots=True)
class FlyParams:
    """FLy knobs (``vllm/config/speculative.py``): window W, entropy threshold (nats), top-k."""

    window: int
    entropy_threshold: float
    top_k: int = 3


@dataclass
class SyntheticLM:
    """Target and draft models over a small vocabulary; see the module docstring."""

    config: LMConfig = field(default_factory=LMConfig)

    def __post_init__(self) -> None:
        c = self.config
        rng = np.random.default_rng(c.seed)
        self.vocab_size = c.vocab_size
        self.n_filler = c.vocab_size - FIRST_FILLER
        self.table_target = rng.standard_normal((c.table_rows, self.n_filler))
        self.table_draft = rng.standard_normal((c.table_rows, self.n_filler))
        self.table_digits = rng.standard_normal((c.table_rows, 10))
        self.sharp = c.target_sharpness * np.exp(
            c.sharpness_spread * rng.standard_normal(c.table_rows)
        )
        self.pieces = vocabulary(c.vocab_size)
        self._salt = np.uint64(c.seed * 7919 + 17)

    # -- context hash -------------------------------------------------------------------------
    def _hash(self, salt: U64, st: DynState, extra: int) -> I64:
        key = (
            salt
            ^ (st.prev1.astype(np.uint64) * np.uint64(0x9E3779B1))
            ^ (st.prev2.astype(np.uint64) * np.uint64(0x85EBCA77))
            ^ (st.t.astype(np.uint64) * np.uint64(0xC2B2AE3D))
            ^ np.uint64(extra)
            ^ self._salt
        )
        return (mix64(key) % np.uint64(self.config.table_rows)).astype(np.int64)

    # -- distributions ------------------------------------------------------------------------
    def target_and_draft(
        self, table: SeqTable, rows: I64, st: DynState, draft_noise: F64
    ) -> tuple[F64, F64]:
        """Unprocessed target probabilities and draft probabilities, each (n, V)."""
        n = rows.shape[0]
        v = self.vocab_size
        c = self.config
        salt = table.salt[rows]
        h = self._hash(salt, st, 1)
        hd = self._hash(salt, st, 2)
        # filler logits: sharpness * table row
        logit_t = self.table_target[h] * self.sharp[h][:, None]
        logit_d = logit_t + draft_noise[:, None] * self.table_draft[hd]
        ft = np.exp(logit_t - logit_t.max(axis=1, keepdims=True))
        ft /= ft.sum(axis=1, keepdims=True)
        fd = np.exp(logit_d - logit_d.max(axis=1, keepdims=True))
        fd /= fd.sum(axis=1, keepdims=True)
        p = np.zeros((n, v))
        q = np.zeros((n, v))
        reason = st.phase == PHASE_REASON
        answer = st.phase == PHASE_ANSWER
        tail = st.phase == PHASE_TAIL
        # reason: filler, then the marker once past the reasoning length
        past = reason & ((st.t - st.rstart) >= table.reason_len[rows])
        w_marker = np.where(past, c.marker_prob, 0.0)
        # tail: filler, then EOS once past the tail length
        w_eos = np.where(tail & (st.tidx >= table.tail_len[rows]), c.eos_prob, 0.0)
        w_fill = np.where(answer, 0.0, 1.0 - w_marker - w_eos)
        p[:, FIRST_FILLER:] = ft * w_fill[:, None]
        q[:, FIRST_FILLER:] = fd * w_fill[:, None]
        p[:, MARKER] = w_marker
        q[:, MARKER] = w_marker
        p[:, EOS] = w_eos
        q[:, EOS] = w_eos
        if answer.any():
            a = np.nonzero(answer)[0]
            ar = rows[a]
            d = np.minimum(st.didx[a], MAX_ANSWER_DIGITS - 1)
            gold = table.gold[ar, d]
            dis = table.distractor[ar, d]
            gm = table.gold_mass[ar]
            dm = table.distractor_mass[ar]
            rest = np.exp(self.table_digits[h[a]])
            rest[np.arange(a.shape[0]), gold] = 0.0
            rest[np.arange(a.shape[0]), dis] = 0.0
            rest *= (1.0 - gm - dm)[:, None] / rest.sum(axis=1, keepdims=True)
            pd = rest
            pd[np.arange(a.shape[0]), gold] = gm
            pd[np.arange(a.shape[0]), dis] = dm
            # draft digits: target digits plus noise, then the distractor pull
            nd = np.exp(
                np.log(np.maximum(pd, 1e-12)) + draft_noise[a, None] * self.table_digits[hd[a]]
            )
            nd /= nd.sum(axis=1, keepdims=True)
            conf = table.confusion[ar]
            nd *= (1.0 - conf)[:, None]
            nd[np.arange(a.shape[0]), dis] += conf
            p[a, DIGIT0 : DIGIT0 + 10] = pd
            q[a, DIGIT0 : DIGIT0 + 10] = nd
        return p, q

    def text(self, tokens: list[int]) -> str:
        """Detokenise (EOS has empty text)."""
        return "".join(self.pieces[t] for t in tokens)


def process_probs(p: F64, temperature: F64, top_p: F64) -> F64:
    """Apply temperature and top-p to each row (temperature 0 gives a one-hot argmax row)."""
    greedy = temperature <= 0.0
    out = p.copy()
    hot = ~greedy & (np.abs(temperature - 1.0) > 1e-12)
    if hot.any():
        with np.errstate(divide="ignore"):
            lp = np.log(out[hot]) / temperature[hot, None]
        lp -= lp.max(axis=1, keepdims=True)
        e = np.exp(lp)
        out[hot] = e / e.sum(axis=1, keepdims=True)
    cut = ~greedy & (top_p < 1.0)
    if cut.any():
        sub = out[cut]
        order = np.argsort(-sub, axis=1)
        sorted_p = np.take_along_axis(sub, order, axis=1)
        csum = np.cumsum(sorted_p, axis=1)
        keep_sorted = (csum - sorted_p) < top_p[cut, None]
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=1)
        sub = np.where(keep, sub, 0.0)
        out[cut] = sub / sub.sum(axis=1, keepdims=True)
    if greedy.any():
        g = np.nonzero(greedy)[0]
        am = np.argmax(p[g], axis=1)
        out[g] = 0.0
        out[g, am] = 1.0
    return out


def verify_arrays(
    *,
    p: F64,
    q: F64,
    drafts: I64,
    num_drafts: I64,
    greedy: B8,
    u_accept: F64,
    entropy_probs: F64 | None = None,
    fly: FlyParams | None = None,
) -> tuple[I64, I64, B8]:
    """Core accept/reject decision on arrays (pure; no sampling of the final token).

    Shapes: ``p`` processed target probs (n, K+1, V); ``q`` draft probs (n, K, V) (one-hot rows
    for a greedy drafter); ``drafts`` (n, K); ``num_drafts`` K_d per row (drafts past K_d are
    padding); ``greedy`` per row; ``u_accept`` (n, K) uniforms; ``entropy_probs`` (n, K, V) the
    probabilities FLy's entropy gate and p(x) > 0 check read (defaults to ``p``).
    Returns (accepted length, waivers inside the accepted prefix, final acceptance mask (n, K)).
    """
    n, k = drafts.shape
    if k == 0:
        return np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros((n, 0), np.bool_)
    ar = np.arange(n)[:, None]
    jj = np.arange(k)[None, :]
    valid = jj < num_drafts[:, None]
    px = p[ar, jj, drafts]
    qx = q[ar, jj, drafts]
    random_native = px >= u_accept * qx
    random_native &= qx > 0
    argmax_p = np.argmax(p[:, :k, :], axis=2)
    greedy_native = drafts == argmax_p
    native = np.where(greedy[:, None], greedy_native, random_native) & valid
    acc = native
    waived = np.zeros((n, k), np.bool_)
    if fly is not None:
        ep = p[:, :k, :] if entropy_probs is None else entropy_probs
        h = topk_entropy(ep, fly.top_k)
        epx = ep[ar, jj, drafts]
        ok_token = (drafts >= 0) & (epx > 0) & (greedy[:, None] | (qx > 0))
        fits = (jj + fly.window) < num_drafts[:, None]
        window_ok = np.ones((n, k), np.bool_)
        for w in range(1, fly.window + 1):
            shifted = np.zeros((n, k), np.bool_)
            if w < k:
                shifted[:, : k - w] = native[:, w:]
            window_ok &= shifted
        waived = ~native & valid & ok_token & fits & (h >= fly.entropy_threshold) & window_ok
        acc = native | waived
    lead = np.cumprod(acc, axis=1).astype(np.bool_)
    accepted = lead.sum(axis=1).astype(np.int64)
    waived_in = (waived & lead).sum(axis=1).astype(np.int64)
    return accepted, waived_in, acc


class DraftSampleMethod(enum.StrEnum):
    """How the drafter picks its tokens (vLLM ``draft_sample_method``; default greedy)."""

    GREEDY = "greedy"
    RANDOM = "random"


def verify(
    lm: SyntheticLM,
    table: SeqTable,
    rows: I64,
    num_drafts: I64,
    *,
    draft_noise: F64,
    fly: FlyParams | None,
    draft_method: DraftSampleMethod = DraftSampleMethod.GREEDY,
) -> VerifyResult:
    """Draft K_d tokens per row, verify them against the target and pick the final token.

    Rows with ``num_drafts == 0`` simply sample one token from the target (a non-speculative
    step, also used for the token that completes a prefill). Uses the rows' counter-based seeds.
    """
    n = rows.shape[0]
    kmax = int(num_drafts.max()) if n else 0
    v = lm.vocab_size
    temp = table.temperature[rows]
    top_p = table.top_p[rows]
    greedy = temp <= 0.0
    seed = table.seed[rows]
    gold_len = table.gold_len[rows]
    st = DynState.of(table, rows)
    t0 = st.t.copy()
    p_all = np.zeros((n, kmax + 1, v))
    pm_all = np.zeros((n, kmax, v))
    q_all = np.zeros((n, kmax, v))
    drafts = np.zeros((n, kmax), np.int64)
    states = [st.copy()]
    for j in range(kmax + 1):
        pm, qm = lm.target_and_draft(table, rows, st, draft_noise)
        p_all[:, j] = process_probs(pm, temp, top_p)
        if j == kmax:
            break
        pm_all[:, j] = pm
        if draft_method is DraftSampleMethod.RANDOM:
            qt = process_probs(qm, temp, top_p)
            x = _sample_rows(qt, counter_uniforms(seed, t0 + j, SLOT_DRAFT))
            xg = np.argmax(qm, axis=1)
            x = np.where(greedy, xg, x)
            qrow = np.where(greedy[:, None], 0.0, qt)
            qrow[greedy, xg[greedy]] = 1.0
        else:
            x = np.argmax(qm, axis=1).astype(np.int64)
            qrow = np.zeros((n, v))
            qrow[np.arange(n), x] = 1.0
        q_all[:, j] = qrow
        drafts[:, j] = x
        st.advance(x, gold_len, mask=j < num_drafts)
        states.append(st.copy())
    u_acc = counter_uniforms(seed[:, None], t0[:, None] + np.arange(kmax)[None, :], SLOT_ACCEPT)
    # entropy gate reads processed probs for random rows, raw target probs for greedy rows
    ent = np.where(greedy[:, None, None], pm_all, p_all[:, :kmax])
    accepted, waived, _ = verify_arrays(
        p=p_all,
        q=q_all,
        drafts=drafts,
        num_drafts=num_drafts,
        greedy=greedy,
        u_accept=u_acc,
        entropy_probs=ent,
        fly=fly,
    )
    # final token at position a: recovered (a < K_d) or bonus (a == K_d)
    ar = np.arange(n)
    pa = p_all[ar, accepted]
    qa = np.zeros((n, v))
    rejected = accepted < num_drafts
    if kmax:
        qa[rejected] = q_all[ar[rejected], accepted[rejected]]
    resid = np.where(rejected[:, None], np.maximum(pa - qa, 0.0), pa)
    empty = resid.sum(axis=1) <= 0
    resid[empty] = pa[empty]
    u_emit = counter_uniforms(seed, t0 + accepted, SLOT_EMIT)
    final = _sample_rows(resid, u_emit)
    final = np.where(greedy, np.argmax(pa, axis=1), final)
    # state after accepted drafts, then the final token
    fin = DynState(
        *(
            np.stack([getattr(s, name) for s in states], axis=1)[ar, accepted]
            for name in ("t", "phase", "didx", "tidx", "rstart", "prev1", "prev2")
        )
    )
    fin.advance(final, gold_len)
    toks_arr = np.concatenate([drafts, final[:, None]], axis=1)
    acc_list = accepted.tolist()
    fin_list = final.tolist()
    drafts_list = drafts.tolist()
    tokens = [[*drafts_list[i][: acc_list[i]], fin_list[i]] for i in range(n)]
    del toks_arr
    return VerifyResult(accepted=accepted, tokens=tokens, waived=waived, final_state=fin)


def commit_state(table: SeqTable, rows: I64, st: DynState) -> None:
    """Write a batch's dynamic state back into the table."""
    table.t[rows] = st.t
    table.phase[rows] = st.phase
    table.didx[rows] = st.didx
    table.tidx[rows] = st.tidx
    table.rstart[rows] = st.rstart
    table.prev1[rows] = st.prev1
    table.prev2[rows] = st.prev2

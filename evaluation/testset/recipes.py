"""What the synthetic cases are: recipes per profile and the value generators.

Categories (design note "The held-out test set"): ``hard`` (long context,
``q_len != kv_len`` both ways, GQA, lengths that are not block multiples, head_dim
32..256, all dtypes, causal, padding) and ``adversarial`` (huge-magnitude logits,
near-ties, rows with every key masked, constant inputs, values near dtype limits,
single-key rows). Random cases are reproducible from their seed (NumPy ``PCG64``).
The ``ordinary`` category comes from the real model (``evaluation.testset.capture``);
its plan per profile lives here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import jax.numpy as jnp
import numpy as np

from evaluation.cases import Category, Split, TestCase, make_case

Profile = Literal["ci", "gpu", "minimal"]
Values = Literal["normal", "huge_logits", "near_ties", "constant", "near_limit"]
Lengths = Literal["none", "random", "with_zero", "single_key"]

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(jnp.bfloat16),
          "float16": np.dtype(np.float16)}


@dataclass(frozen=True)
class Recipe:
    """A synthetic case: shapes, dtype, masking and how values are drawn.

    ``lengths``: ``none``; ``random`` q/kv lengths in ``[1, len]``; ``with_zero``
    random lengths with one example whose q and kv lengths are 0 and one whose kv
    length is 0 (every key masked); ``single_key`` kv length 1 for every example.
    """

    name: str
    category: Category
    tags: tuple[str, ...]
    q_len: int
    kv_len: int
    batch: int = 1
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 64
    dtype: str = "float32"
    causal: bool = False
    scale: float | None = None
    lengths: Lengths = "none"
    values: Values = "normal"


def _hard(name, tags, q_len, kv_len, **kw) -> Recipe:
    return Recipe(name, "hard", tags, q_len, kv_len, **kw)


def _adv(name, tags, q_len, kv_len, **kw) -> Recipe:
    return Recipe(name, "adversarial", tags, q_len, kv_len, **kw)


# The CI profile keeps most sequences <= 512 and two at 1024/2048, so that evaluating
# a kernel in TPU interpret mode (cost ~ number of blocks) on a split takes minutes.
_CI_HARD = (
    _hard("long-2048-causal", ("long", "causal"), 2048, 2048, num_heads=2, num_kv_heads=2,
          dtype="bfloat16", causal=True),
    _hard("long-1024", ("long",), 1024, 1024, num_heads=2, num_kv_heads=2),
    _hard("q-shorter-than-kv", ("q_len!=kv_len",), 128, 512, batch=2),
    _hard("q-longer-than-kv-causal", ("q_len!=kv_len", "causal", "non_block_multiple"), 300, 129,
          dtype="bfloat16", causal=True),
    _hard("gqa2", ("gqa",), 256, 256, batch=2, num_heads=8, num_kv_heads=4, dtype="float16"),
    _hard("gqa3-causal", ("gqa", "causal", "non_block_multiple"), 129, 129, num_heads=6,
          num_kv_heads=2, causal=True),
    _hard("mqa", ("gqa", "mqa", "q_len!=kv_len"), 200, 300, num_heads=8, num_kv_heads=1,
          dtype="bfloat16"),
    _hard("decode-q1", ("non_block_multiple", "q_len!=kv_len"), 1, 127, batch=2),
    _hard("len127-causal-d32", ("non_block_multiple", "causal", "head_dim"), 127, 127,
          head_dim=32, dtype="float16", causal=True),
    _hard("len1", ("non_block_multiple",), 1, 1, batch=3),
    _hard("d80", ("head_dim", "non_power_of_two"), 256, 256, head_dim=80, dtype="bfloat16"),
    _hard("d128-causal", ("head_dim", "causal"), 384, 384, head_dim=128, causal=True),
    _hard("d256", ("head_dim", "q_len!=kv_len"), 256, 128, num_heads=2, num_kv_heads=2,
          head_dim=256, dtype="float16"),
    _hard("padding-zero-causal", ("padding", "zero_length", "causal"), 256, 256, batch=3,
          causal=True, lengths="with_zero"),
    _hard("padding-gqa", ("padding", "gqa", "q_len!=kv_len"), 128, 384, batch=4, num_heads=8,
          num_kv_heads=2, dtype="bfloat16", lengths="random"),
    _hard("custom-scale", ("scale",), 64, 64, scale=0.3),
)

_CI_ADVERSARIAL = (
    _adv("huge-logits", ("huge_logits", "softmax_overflow"), 128, 128, values="huge_logits"),
    _adv("huge-logits-causal-bf16", ("huge_logits", "softmax_overflow", "causal"), 256, 256,
         num_heads=2, num_kv_heads=2, dtype="bfloat16", causal=True, values="huge_logits"),
    _adv("near-ties", ("near_ties",), 128, 256, values="near_ties"),
    _adv("all-keys-masked", ("all_masked", "padding", "zero_length"), 64, 128, batch=3,
         lengths="with_zero"),
    _adv("all-keys-masked-gqa-bf16", ("all_masked", "padding", "gqa"), 129, 129, batch=3,
         num_heads=4, num_kv_heads=2, dtype="bfloat16", lengths="with_zero"),
    _adv("constant", ("constant",), 128, 128, values="constant"),
    _adv("constant-causal-bf16", ("constant", "causal"), 129, 129, dtype="bfloat16",
         causal=True, values="constant"),
    _adv("near-limit-f16", ("near_limit",), 128, 128, dtype="float16", values="near_limit"),
    _adv("near-limit-bf16", ("near_limit",), 128, 256, dtype="bfloat16", values="near_limit"),
    _adv("single-key", ("single_key",), 64, 1),
    _adv("single-key-padded-f16", ("single_key", "padding"), 128, 128, batch=2,
         dtype="float16", lengths="single_key"),
)

_GPU_EXTRA_HARD = (
    _hard("long-4096", ("long",), 4096, 4096, num_heads=8, num_kv_heads=8, head_dim=128,
          dtype="bfloat16"),
    _hard("long-8192-causal-gqa", ("long", "causal", "gqa"), 8192, 8192, num_heads=8,
          num_kv_heads=2, head_dim=128, dtype="bfloat16", causal=True),
    _hard("long-16384-causal", ("long", "causal", "gqa"), 16384, 16384, num_heads=2,
          num_kv_heads=1, head_dim=128, dtype="bfloat16", causal=True),
    _hard("long-decode", ("long", "q_len!=kv_len"), 64, 8192, num_heads=8, num_kv_heads=1,
          head_dim=128, dtype="float16"),
    _hard("long-padding", ("long", "padding"), 4096, 4096, batch=2, num_heads=4,
          num_kv_heads=4, head_dim=64, dtype="bfloat16", lengths="random"),
    _hard("long-padding-d128", ("long", "padding", "head_dim"), 2048, 2048, batch=2,
          num_heads=4, num_kv_heads=4, head_dim=128, dtype="bfloat16", lengths="random"),
)

# Adversarial cases inside the long-sequence low-precision contracts (thresholds/bf16-long:
# bf16, head_dim 64-256, S >= 1024): without them every rollout of such a registration was
# inconclusive on its adversarial criterion (H200, 2026-12-01). The single-key case is the
# "large equal values, very few visible keys" kind from public bug reports.
_GPU_EXTRA_ADVERSARIAL = (
    _adv("long-huge-logits-causal-bf16", ("long", "huge_logits", "softmax_overflow", "causal"),
         2048, 2048, num_heads=2, num_kv_heads=2, head_dim=128, dtype="bfloat16", causal=True,
         values="huge_logits"),
    _adv("long-all-keys-masked-bf16", ("long", "all_masked", "padding", "zero_length"), 1024,
         1024, batch=3, num_heads=2, num_kv_heads=2, head_dim=64, dtype="bfloat16",
         lengths="with_zero"),
    _adv("long-near-limit-bf16-d256", ("long", "near_limit", "head_dim", "q_len!=kv_len"), 1024,
         2048, num_heads=2, num_kv_heads=2, head_dim=256, dtype="bfloat16", values="near_limit"),
    _adv("long-constant-causal-bf16", ("long", "constant", "causal"), 1024, 1024, num_heads=2,
         num_kv_heads=2, head_dim=128, dtype="bfloat16", causal=True, values="constant"),
    _adv("long-single-key-padded-bf16", ("long", "single_key", "padding"), 1024, 1024, batch=2,
         num_heads=2, num_kv_heads=2, head_dim=64, dtype="bfloat16", lengths="single_key"),
    # inside an encoder's contract (non-causal, head_dim 128 only: thresholds/
    # adoption-longdoc-hd128, FlashAttention-3's one head_dim), where every case above is
    # causal or of another head_dim
    _adv("long-huge-logits-bf16-d128", ("long", "huge_logits", "softmax_overflow", "head_dim"),
         2048, 2048, num_heads=2, num_kv_heads=2, head_dim=128, dtype="bfloat16",
         values="huge_logits"),
    _adv("long-single-key-padded-bf16-d128", ("long", "single_key", "padding", "head_dim"),
         1024, 1024, batch=2, num_heads=2, num_kv_heads=2, head_dim=128, dtype="bfloat16",
         lengths="single_key"),
)




def _named(recipes: tuple[Recipe, ...], *names: str) -> tuple[Recipe, ...]:
    by_name = {r.name: r for r in recipes}
    return tuple(by_name[n] for n in names)


# The minimal profile: CI recipes, unchanged, as few as the test-set validation accepts
# (``evaluation.validation.MIN_CASES_PER_CATEGORY``: 8 hard, 6 adversarial, 3 ordinary)
# and none over 384 tokens. Every category, every dtype, causal, GQA 2 and 3, MQA,
# q_len != kv_len both ways, lengths 1/127/129/300, head_dim 32..256 (80 among them),
# zero-length rows, huge logits and near-limit values stay; the long (1024, 2048) and the
# larger cases go. For the pipeline's own flow tests (a rollout's decisions and records;
# the suite runs about 15 test rollouts), never for judging a kernel: the gate's accuracy
# evidence on a CPU host is the ``ci`` profile's.
_MINIMAL_HARD = _named(_CI_HARD, "q-longer-than-kv-causal", "gqa3-causal", "mqa", "decode-q1",
                       "len127-causal-d32", "d80", "d256", "padding-zero-causal")
_MINIMAL_ADVERSARIAL = _named(_CI_ADVERSARIAL, "huge-logits", "near-ties",
                              "all-keys-masked-gqa-bf16", "constant", "near-limit-f16",
                              "single-key-padded-f16")


@dataclass(frozen=True)
class OrdinaryPlan:
    """How many documents and which layers feed the ordinary cases of one split."""

    single_layers: tuple[tuple[int, str], ...]  # (layer, dtype) per single-document case
    batched_layers: tuple[tuple[int, str], ...]  # (layer, dtype) per batched case (one batch)
    batch: int
    max_length: int

    @property
    def documents_needed(self) -> int:
        return len(self.single_layers) + self.batch


@dataclass(frozen=True)
class ProfileSpec:
    """The recipes and ordinary-case plan of a profile (``ci``, ``gpu`` or ``minimal``)."""

    hard: tuple[Recipe, ...]
    adversarial: tuple[Recipe, ...]
    ordinary: OrdinaryPlan


PROFILES: dict[str, ProfileSpec] = {
    "ci": ProfileSpec(_CI_HARD, _CI_ADVERSARIAL,
                      OrdinaryPlan(single_layers=((0, "float32"), (5, "float16")),
                                   batched_layers=((2, "float32"), (4, "bfloat16")),
                                   batch=4, max_length=256)),
    "gpu": ProfileSpec(_CI_HARD + _GPU_EXTRA_HARD, _CI_ADVERSARIAL + _GPU_EXTRA_ADVERSARIAL,
                       OrdinaryPlan(single_layers=((0, "float32"), (3, "bfloat16"),
                                                   (5, "float16")),
                                    batched_layers=((1, "float32"), (2, "bfloat16"),
                                                    (4, "float16")),
                                    batch=8, max_length=512)),
    "minimal": ProfileSpec(_MINIMAL_HARD, _MINIMAL_ADVERSARIAL,
                           OrdinaryPlan(single_layers=((0, "float32"), (5, "float16")),
                                        batched_layers=((4, "bfloat16"),),
                                        batch=2, max_length=128)),
}


# --- value generators ---------------------------------------------------------------------


def _normal(rng, shape) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _huge_logits(rng, q_shape, kv_shape, dtype):
    # |q.k| * scale ~ a^2 * N(0, 1) with a = 100: logits of order 1e4, so exp overflows
    # float32 unless the row max is subtracted (the online-softmax invariant).
    a = np.float32(100.0)
    return a * _normal(rng, q_shape), a * _normal(rng, kv_shape), _normal(rng, kv_shape)


def _near_ties(rng, q_shape, kv_shape, dtype):
    # Keys differ from one shared key by 1e-3 relative noise: logits within ~1e-3 of
    # each other, so the result hinges on summing many nearly equal probabilities.
    base = _normal(rng, (kv_shape[0], 1, *kv_shape[2:]))
    k = base + np.float32(1e-3) * _normal(rng, kv_shape)
    return _normal(rng, q_shape), k, _normal(rng, kv_shape)


def _constant(rng, q_shape, kv_shape, dtype):
    # Every logit equal, every value row equal: the exact output is the constant.
    c = np.float32(rng.uniform(0.5, 2.0))
    return np.full(q_shape, c, np.float32), np.full(kv_shape, c, np.float32), \
        np.full(kv_shape, c, np.float32)


def _near_limit(rng, q_shape, kv_shape, dtype):
    """Values near the top of the storage dtype's range.

    float16 (max 65504): q, k, v with magnitudes in [0.5, 0.9] * 65504; their logits
    (<= head_dim * 65504^2 * scale ~ 3e10) are finite in float32 but not in float16,
    so a kernel must form q.k in float32. bfloat16/float32 (max ~3.4e38): v at ~1e30,
    leaving 2^26 headroom for float32 accumulation of un-normalised sums, with
    q and k ordinary so the logits stay finite.
    """
    def big(shape, limit):
        sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0).astype(np.float32)
        return sign * rng.uniform(0.5, 0.9, shape).astype(np.float32) * np.float32(limit)

    if dtype == "float16":
        return big(q_shape, 65504.0), big(kv_shape, 65504.0), big(kv_shape, 65504.0)
    return _normal(rng, q_shape), _normal(rng, kv_shape), big(kv_shape, 1e30)


_VALUE_GENERATORS: dict[str, Callable] = {
    "normal": lambda rng, qs, ks, dt: (_normal(rng, qs), _normal(rng, ks), _normal(rng, ks)),
    "huge_logits": _huge_logits,
    "near_ties": _near_ties,
    "constant": _constant,
    "near_limit": _near_limit,
}


def _lengths(rng, recipe: Recipe) -> tuple[np.ndarray | None, np.ndarray | None]:
    b = recipe.batch
    if recipe.lengths == "none":
        return None, None
    if recipe.lengths == "single_key":
        return None, np.ones(b, np.int32)
    q = rng.integers(1, recipe.q_len + 1, b).astype(np.int32)
    kv = rng.integers(1, recipe.kv_len + 1, b).astype(np.int32)
    if recipe.lengths == "with_zero":
        if b < 2:
            raise ValueError(f"recipe {recipe.name}: lengths='with_zero' needs batch >= 2")
        kv[0] = 0           # every key masked, queries valid
        q[1], kv[1] = 0, 0  # an empty example
        q[-1], kv[-1] = recipe.q_len, recipe.kv_len  # one full row keeps the case non-trivial
    return q, kv


def synthetic_case(recipe: Recipe, split: Split, seed: int) -> TestCase:
    """Draw the arrays of ``recipe`` from ``np.random.default_rng(seed)``.

    Returns:
        A ``TestCase`` with ``q`` ``[batch, q_len, num_heads, head_dim]``, ``k``/``v``
        ``[batch, kv_len, num_kv_heads, head_dim]`` in ``recipe.dtype`` and int32
        lengths when the recipe masks; ``spec.source`` is ``seed:<seed>``.

    Raises:
        ValueError: an inconsistent recipe (heads not divisible, lengths need batch).
    """
    if recipe.num_heads % recipe.num_kv_heads:
        raise ValueError(f"recipe {recipe.name}: num_heads must be a multiple of num_kv_heads")
    rng = np.random.default_rng(seed)
    q_shape = (recipe.batch, recipe.q_len, recipe.num_heads, recipe.head_dim)
    kv_shape = (recipe.batch, recipe.kv_len, recipe.num_kv_heads, recipe.head_dim)
    q, k, v = _VALUE_GENERATORS[recipe.values](rng, q_shape, kv_shape, recipe.dtype)
    q_lengths, kv_lengths = _lengths(rng, recipe)
    dtype = DTYPES[recipe.dtype]
    return make_case(
        case_id=f"{split}/{recipe.category}/{recipe.name}", category=recipe.category,
        tags=recipe.tags, q=q.astype(dtype), k=k.astype(dtype), v=v.astype(dtype),
        q_lengths=q_lengths, kv_lengths=kv_lengths, causal=recipe.causal, scale=recipe.scale,
        source=f"seed:{seed}")

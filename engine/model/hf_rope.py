"""rope_theta and rope scaling (linear, llama3, YaRN) read from config.json as transformers
reads them."""

from typing import Any

from engine.config import Family, RopeScaling
from engine.model.hf_fields import bool_field, field, int_field, number_field, refuse

DEFAULT_ROPE_THETA: dict[Family, float] = {"mixtral": 1e6}


ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _ropes(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The `rope_scaling` and `rope_parameters` dicts; a rope type we cannot run is refused."""
    ropes = {key: field(c, key, (dict,), {}) for key in ("rope_scaling", "rope_parameters")}
    for key, rope in ropes.items():
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        refuse(
            rope_type not in ROPE_TYPES,
            f"unsupported rope scaling {rope_type!r} (config.json {key!r}): moescope runs "
            f"{list(ROPE_TYPES)}",
        )
    return ropes


def rope_theta(c: dict[str, Any], family: Family) -> float:
    """rope_theta as transformers reads it (`rope_scaling` over `rope_parameters` over the top
    level)."""
    ropes = _ropes(c)
    theta = number_field(c, "rope_theta", DEFAULT_ROPE_THETA.get(family, 10000.0))
    return number_field(ropes["rope_scaling"] or ropes["rope_parameters"], "rope_theta", theta)


def rope_scaling(c: dict[str, Any]) -> RopeScaling | None:
    """linear, llama3 or YaRN scaling from `rope_scaling` (over `rope_parameters`)."""
    ropes = _ropes(c)
    key = "rope_scaling" if ropes["rope_scaling"] else "rope_parameters"
    r = ropes[key]
    rope_type = r.get("rope_type", r.get("type", "default"))
    if rope_type == "default":
        return None
    where = f"rope scaling {rope_type!r} (config.json {key!r})"
    factor = number_field(r, "factor", None)
    if rope_type == "linear":
        refuse(factor is None, f"{where} needs a factor")
        return RopeScaling("linear", factor)
    original = int_field(r, "original_max_position_embeddings", c.get("max_position_embeddings"))
    refuse(original is None, f"{where} needs original_max_position_embeddings")
    if factor is None:  # transformers infers YaRN's factor from the two lengths
        refuse(rope_type != "yarn", f"{where} needs a factor")
        factor = int_field(c, "max_position_embeddings") / original
    if rope_type == "llama3":
        low, high = number_field(r, "low_freq_factor"), number_field(r, "high_freq_factor")
        refuse(low == high, f"{where}: low_freq_factor equals high_freq_factor")
        return RopeScaling("llama3", factor, original, low_freq_factor=low, high_freq_factor=high)
    return RopeScaling(
        "yarn",
        factor,
        original,
        beta_fast=number_field(r, "beta_fast", 32.0),
        beta_slow=number_field(r, "beta_slow", 1.0),
        mscale=number_field(r, "mscale", 0.0),
        mscale_all_dim=number_field(r, "mscale_all_dim", 0.0),
        attention_factor=number_field(r, "attention_factor", None),
        truncate=bool_field(r, "truncate", True),
    )

"""What-if measurements for the lent GPU: `fxformer.bench` with one part of the step changed.

    python3 experiments/gpu/diag.py VARIANT [bench arguments...]

Diagnostics, not options: a variant that drops the mask trains a different model; it bounds
what a change of that part could gain, so the next change is chosen by measurement.

- `mask_heads_1`: the packed rows' segment mask goes to cuDNN as [b, 1, q, k] (one bias for all
  heads) instead of broadcast to [b, h, q, k];
- `no_mask`: packed rows get no segment mask at all (`is_causal` alone): the attention time of a
  kernel that knew the segments and skipped what they hide would be at most this.
"""

import sys

from fxformer import bench, cli, model


def packed_arguments(variant: str):
    original = model.fused_mask_arguments

    def arguments(mask: model.AttentionMask, num_heads: int) -> dict:
        if not mask.packed:
            return original(mask, num_heads)
        if variant == "no_mask":
            return {"is_causal": mask.causal}
        padding = (mask.q_segments == 0)[:, None, :, None]
        return {"mask": model.segment_mask(mask.q_segments, mask.kv_segments) | padding, "is_causal": mask.causal}

    return arguments


if __name__ == "__main__":
    variant = sys.argv.pop(1)
    assert variant in ("mask_heads_1", "no_mask"), variant
    model.fused_mask_arguments = packed_arguments(variant)
    cli.run(bench.main)

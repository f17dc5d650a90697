"""Why the Llama example's prefill logits matched the stock model's bit for bit (examples/llama_linear.py): does a
prefill forward reach the generated kernels? Counts each swapped Linear's calls and rows in a prefill and a decode
forward, and compares one layer's prefill output with F.linear on the same input.

    python3 gpu/debug/llama_prefill_probe.py
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from generator.nn import Linear, replace_linear  # noqa: E402


def main() -> None:
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                         num_attention_heads=16, num_key_value_heads=8, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        stock = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    ours = copy.deepcopy(stock)
    replace_linear(ours)
    calls: list[tuple[str, tuple[int, ...], float]] = []

    def hook(name):
        def record(module, inputs, output):
            x = inputs[0]
            ref = F.linear(x, module.weight, module.bias)
            calls.append((name, tuple(x.shape), ((output.float() - ref.float()).norm() / ref.float().norm()).item()))
        return record

    for name, module in ours.named_modules():
        if isinstance(module, Linear):
            module.register_forward_hook(hook(name))
    ids = torch.randint(0, 32000, (4, 512), device="cuda")
    with torch.no_grad():
        a = stock(input_ids=ids, use_cache=False).logits
        b = ours(input_ids=ids, use_cache=False).logits
    print(f"prefill: {len(calls)} Linear calls; logits rel diff {((a.float() - b.float()).norm() / a.float().norm()).item():.3e}")
    for name, shape, diff in calls[:8]:
        print(f"  {name:40s} x{shape}  ours vs F.linear {diff:.3e}")
    print("modules of type Linear in ours:", sum(isinstance(m, Linear) for m in ours.modules()))


if __name__ == "__main__":
    main()

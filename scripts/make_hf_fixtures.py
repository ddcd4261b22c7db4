#!/usr/bin/env python3
"""Makes the Hugging Face GPT-J fixtures of tests/fixtures/hf_gptj/ with `transformers`.

Run where torch, transformers, safetensors and tokenizers install from PyPI (not in CI, whose
test, test_hf_import, reads the committed outputs):

  python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers safetensors tokenizers
  /tmp/venv-hf/bin/python scripts/make_hf_fixtures.py [--out tests/fixtures/hf_gptj]

Writes a tiny random GPTJForCausalLM, with dimensions none of nax's configs has, as
`save_pretrained` writes it:

  config.json                          n_embd 32, n_head 4 (head size 8), rotary_dim 6, n_inner 96,
                                       n_layer 2, n_positions 64, layer_norm_epsilon 1e-4, and
                                       vocab_size 1024: the 1001 ids of the committed tokenizer
                                       (tests/fixtures/tokenizer/tokenizer.json) padded, as GPT-J
                                       pads 50257 to 50400; bos/eos = <|endoftext|> (id 0)
  model-0000{1,2}-of-00002.safetensors the weights in F16, two shards
  model.safetensors.index.json         which shard holds which tensor
  logits.safetensors                   ids.K (I32 [tokens]) and logits.K (F32 [tokens, 1024]):
                                       PROMPTS[K] tokenized with `tokenizers`, and the logits of
                                       GPTJForCausalLM in float32 on the F16 weights (loaded
                                       back from the folder)
  prompts.json                         PROMPTS
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import GPTJConfig, GPTJForCausalLM

PROMPTS = [
    "The quick brown fox",
    "It's 42",
    "<|endoftext|>Ça va",
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "hf_gptj"))
    parser.add_argument("--tokenizer", default=os.path.join(here, "..", "tests", "fixtures", "tokenizer", "tokenizer.json"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    tokenizer = Tokenizer.from_file(args.tokenizer)
    eos = tokenizer.token_to_id("<|endoftext|>")
    config = GPTJConfig(vocab_size=1024, n_positions=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=6, n_inner=96,
                        layer_norm_epsilon=1e-4, initializer_range=0.1, bos_token_id=eos, eos_token_id=eos,
                        tie_word_embeddings=False)
    assert tokenizer.get_vocab_size() <= config.vocab_size
    torch.manual_seed(16)
    model = GPTJForCausalLM(config).eval()
    with torch.no_grad():  # biases and LayerNorm gains away from their 0 / 1 init, so that a mix-up shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    model = model.half()
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size="100KB")
    shards = sorted(f for f in os.listdir(args.out) if f.startswith("model-"))
    assert len(shards) == 2, shards

    # The F16 weights exactly, computed in float32: loaded back, so that the rotary tables (a buffer
    # that model.half() would have rounded) are made in float32 again.
    model = GPTJForCausalLM.from_pretrained(args.out, torch_dtype=torch.float32).eval()
    tensors = {}
    for k, prompt in enumerate(PROMPTS):
        ids = tokenizer.encode(prompt).ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        tensors[f"ids.{k}"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"logits.{k}"] = logits.float().contiguous()
    save_file(tensors, os.path.join(args.out, "logits.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "prompts.json"), "w") as f:
        json.dump(PROMPTS, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for name in sorted(os.listdir(args.out)):
        print(f"{os.path.getsize(os.path.join(args.out, name)):8d}  {name}")


if __name__ == "__main__":
    main()

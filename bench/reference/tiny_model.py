"""A tiny causal language model and its tokenizer, made locally (no download), to check an
exported TRL script end to end on any machine: `python3 tiny_model.py DIR`, then
`python3 train_trl.py --model DIR --max-steps 2`.

The model is a 2-layer Llama of width 32 with random weights; the tokenizer is byte-level
(256 byte tokens plus <s>, </s> and <pad>), so it encodes any prompt. It learns nothing worth
keeping: it only shows that the export's config, data and reward functions run in TRL.
"""

import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def byte_level_tokenizer():
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for special in ("<s>", "</s>", "<pad>"):
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def main(out):
    torch.manual_seed(0)
    tokenizer = byte_level_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{len(tokenizer)} tokens")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny-model")

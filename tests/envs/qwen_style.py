"""A Qwen-style tokenizer and chat templates written for the tests (no Hub here).

The tokenizer is a byte-level BPE with Qwen's added tokens: ``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>`` special; ``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``,
``<tool_response>``, ``</tool_response>`` added but NOT special, as in Qwen2.5 / Qwen3.

``QWEN3_TEMPLATE`` follows the published Qwen3 template's behaviour: tools as JSON in the system
turn, calls as ``<tool_call>{json}</tool_call>``, consecutive tool results in one user turn as
``<tool_response>`` blocks, ``enable_thinking=False`` closing an empty think block in the
generation prompt, and the reasoning of assistant turns before the last user message dropped
(not prefix-stable). ``HERMES_TEMPLATE`` is the same without reasoning handling (prefix-stable).
"""

from __future__ import annotations

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

_SYSTEM = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions.\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call return <tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
"""

_CALLS = """\
{%- if message.tool_calls %}{%- for tc in message.tool_calls %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}
{%- set f = tc.function if tc.function else tc %}
{{- '<tool_call>\\n{"name": "' + f.name + '", "arguments": ' }}
{{- (f.arguments if f.arguments is string else f.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}{%- endif %}
"""

_TOOL = """\
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
"""

QWEN3_TEMPLATE = (
    _SYSTEM
    + """\
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}
{%- if message.role == 'user'
      and not (message.content is string and message.content.startswith('<tool_response>')) %}
{%- set ns.last_query = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{%- set reasoning = '' %}
{%- if '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query and reasoning %}
{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') }}
{{- '\\n</think>\\n\\n' + content.lstrip('\\n') }}
{%- else %}
{{- '<|im_start|>assistant\\n' + content }}
{%- endif %}
"""
    + _CALLS
    + """\
{{- '<|im_end|>\\n' }}
"""
    + _TOOL
    + """\
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""
)

HERMES_TEMPLATE = (
    _SYSTEM
    + """\
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + content }}
"""
    + _CALLS
    + """\
{{- '<|im_end|>\\n' }}
"""
    + _TOOL
    + """\
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
)

_CORPUS = [
    'You may call one or more functions.\n{"name": "bash", "arguments": {"command": "ls -la"}}\n',
    "def answer():\n    return 42\n\nimport os, sys\nprint('hello world')\nexit code 0\n",
    "str_replace_editor view create insert undo_edit submit path file_text old_str new_str\n",
    "The user asked a question. Let me think about it step by step.\n",
]


def save_tokenizer(directory: str, template: str = QWEN3_TEMPLATE, vocab_size: int = 512) -> None:
    """Train and save the Qwen-style tokenizer (with ``template``) in ``directory``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS * 20, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = template
    fast.save_pretrained(directory)


def model_config(vocab_size: int) -> dict:
    """A tiny Qwen3 over the tokenizer's vocabulary (head_dim 64: vLLM's CPU kernels need it)."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    }


def save_model(directory: str, template: str = QWEN3_TEMPLATE) -> dict:
    """The tokenizer and a tiny random Qwen3 over its vocabulary; returns the model's config."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    save_tokenizer(directory, template)
    config = model_config(len(AutoTokenizer.from_pretrained(directory)))
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**config)).save_pretrained(directory)
    return config

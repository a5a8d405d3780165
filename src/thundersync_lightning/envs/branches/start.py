"""The starting point of the branch demo: a tokenizer with a tool-capable chat template, and a
tiny Qwen3 that knows the tool-call format but not the task.

Users fine-tune pretrained models that already write their template's tool calls; what RL
teaches them is which tool to call with which arguments. A randomly initialised model almost
never writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` by chance, so the demo
starts from a format-only pretraining, the miniature of that situation:

- the tokenizer is a byte-level BPE trained on renderings of the demo's conversations, with
  Qwen's control tokens (``<|im_start|>``, ``<|im_end|>`` special; ``<tool_call>``,
  ``<tool_response>`` added, not special) and :data:`TEMPLATE`, a Hermes/Qwen-style template:
  tools as JSON schemas in the system turn, calls as ``<tool_call>`` JSON blocks, results as
  ``<tool_response>`` blocks in a user turn;
- the model is trained by next-token cross-entropy on the assistant turns of conversations
  whose calls draw the tool uniformly, independently of the request, and name the request's
  branch with probability ``copy_name`` (else a uniform one); ``prefer_tool`` likewise makes the
  tool the requested one (default 0: the start knows nothing of which tool serves which request;
  another call follows an error result half the time, up to three calls). It learns the syntax,
  the names and, with ``copy_name``, to copy the branch from the request, as pretrained models copy
  entities; which tool to call is left for RL (``configs/tool_learn.yaml``).

    python -m thundersync_lightning.envs.branches.start DIR [--steps N] [--copy-name P] [--prefer-tool P]

writes the tokenizer, the model (``config.json``, weights) and ``start.json`` (loss, time, and
the shares of sampled first turns that parse as a valid call and that are the requested call)
into DIR.

.. note:: With both probabilities 0 the choices are request-blind: the hidden state at the
   tool-name position barely varies between requests, which leaves GRPO almost nothing
   request-dependent to reinforce. With ``copy_name`` the model already reads the request; RL then
   learns the tool.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

from .source import BRANCHES, PHRASES, VERBS, all_branch_tasks, branch_tools, is_held_out

__all__ = ["TEMPLATE", "MODEL_CONFIG", "save_tokenizer", "FormatExamples", "build_start"]

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\nCall a tool: <tool_call>\\n' }}
{{- '{"name": <name>, "arguments": <args>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if message.role == 'user' %}
{{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
"""Hermes/Qwen-style: an assistant message's content is the model's own text, calls included
(the agent loop keeps the sampled ids, so the template never re-renders them)."""

MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


def call_text(tool: str, name: str) -> str:
    """A call as the model writes it (the template's own example format)."""
    return f"<tool_call>\n{json.dumps({'name': tool, 'arguments': {'name': name}})}\n</tool_call>"


def _error(tool: str, name: str) -> str:
    return (
        f"error: no branch named '{name}'"
        if tool != "create_branch"
        else f"error: a branch named '{name}' already exists"
    )


def save_tokenizer(directory: str, vocab_size: int = 768, seed: int = 0) -> None:
    """Train the byte-level BPE on the demo's texts; save it with :data:`TEMPLATE`.

    Merges may cross words, so the tool schemas every prompt repeats cost a few tokens each
    (on two CPU cores the prompt's length is most of a step's cost), but never a tool's or a
    branch's name: a name is always its own token, in the schemas, the requests and the calls,
    so a request of a held-out (verb, branch) pair is spelled with tokens seen in training."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    markup = [
        "system\n# Tools\n<tools>\n",
        "\n</tools>\nCall a tool: ",
        '\n{"name": <name>, "arguments": <args>}\n',
        "user\n",
        "assistant\n",
        "\n",
        "\n<tool_response>\n",
        "error: no branch named ",
        "error: already on ",
        "error: cannot delete the current branch ",
        "error: a branch named ' already exists",
        "[invalid tool call] No tool call found. Call one of the tools; call submit when you are done.",
    ]
    corpus = (markup + [json.dumps(t.schema()) for t in branch_tools()]) * 16
    for phrases in PHRASES.values():
        for phrase in phrases:
            for name in BRANCHES:
                corpus.append(phrase.format(name))
                corpus.append(call_text(f"{rng.choice(VERBS)}_branch", name))
    tok = Tokenizer(models.BPE())
    names = Regex("|".join([t.name for t in branch_tools()] + list(BRANCHES)))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(names, "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus * 4, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(directory)


class FormatExamples:
    """Conversations as token ids and targets (the assistant turns). Each call's tool is the
    requested one with probability ``prefer_tool`` and uniform otherwise; its branch is the
    request's with probability ``copy_name`` and uniform otherwise (both 0: the call is
    independent of the request).

    The ids are built as the agent loop builds them (prompt, the sampled turn, the template's
    suffix after it, ...); :data:`TEMPLATE` is prefix-stable, so each piece depends on its own
    message only and is rendered once."""

    def __init__(
        self, renderer: Any, max_turns: int = 3, copy_name: float = 0.0, prefer_tool: float = 0.0
    ) -> None:
        bad = [
            f"{k}={v}"
            for k, v in (("copy_name", copy_name), ("prefer_tool", prefer_tool))
            if not 0.0 <= v <= 1.0
        ]
        if bad:
            raise ValueError(f"{', '.join(bad)}: a probability in [0, 1]")
        self.renderer, self.max_turns = renderer, max_turns
        self.copy_name, self.prefer_tool = copy_name, prefer_tool
        self.schemas = [t.schema() for t in branch_tools()]
        self._cache: dict[tuple[str, ...], tuple[int, ...]] = {}

    def _piece(self, key: tuple[str, ...]) -> tuple[int, ...]:
        if key not in self._cache:
            kind, *args = key
            user = {"role": "user", "content": args[0] if kind == "prompt" else "x"}
            if kind == "prompt":
                ids = self.renderer.prompt_ids([user], self.schemas)
            elif kind == "call":
                ids = self.renderer.assistant_ids([user], call_text(*args), self.schemas)
            else:
                result = {"role": "tool", "name": args[0], "content": _error(*args)}
                ids = self.renderer.suffix_ids(
                    [user, {"role": "assistant", "content": call_text(*args)}], [result], self.schemas
                )
            self._cache[key] = tuple(ids)
        return self._cache[key]

    def sample(
        self, rng: random.Random, request: str, name: str | None = None, tool: str | None = None
    ) -> tuple[list[int], list[bool]]:
        """One conversation about ``request`` (asking for ``tool`` on branch ``name``): a call;
        after it, half the time, an error result and another call (at most ``max_turns`` calls)."""
        ids = list(self._piece(("prompt", request)))
        targets = [False] * len(ids)
        turns = 1
        while turns < self.max_turns and rng.random() < 0.5:
            turns += 1
        for k in range(turns):
            called = (
                tool
                if tool is not None and rng.random() < self.prefer_tool
                else f"{rng.choice(VERBS)}_branch"
            )
            branch = name if name is not None and rng.random() < self.copy_name else rng.choice(BRANCHES)
            call = self._piece(("call", called, branch))
            ids += call
            targets += [True] * len(call)
            if k + 1 < turns:
                suffix = self._piece(("error", called, branch))
                ids += suffix
                targets += [False] * len(suffix)
        return ids, targets


def build_start(
    directory: str,
    steps: int = 150,
    batch: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    samples: int = 96,
    copy_name: float = 0.0,
    prefer_tool: float = 0.0,
) -> dict[str, Any]:
    """Write the tokenizer and the format-pretrained model into ``directory``; return its record."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ..chat import ChatRenderer

    started = time.monotonic()
    os.makedirs(directory, exist_ok=True)
    save_tokenizer(directory, seed=seed)
    renderer = ChatRenderer(directory)
    requests = [t for t in all_branch_tasks() if not is_held_out(t)]  # training requests only
    examples = FormatExamples(renderer, copy_name=copy_name, prefer_tool=prefer_tool)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(renderer.tokenizer), **MODEL_CONFIG)
    model = Qwen3ForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    pad = renderer.tokenizer.pad_token_id
    losses = []
    for _ in range(steps):
        rows = [
            examples.sample(rng, t.request, t.name, f"{t.verb}_branch")
            for t in (rng.choice(requests) for _ in range(batch))
        ]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in rows])  # (B, T), right-padded
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in rows])
        labels = torch.tensor(
            [[i if t else -100 for i, t in zip(r, tg)] + [-100] * (width - len(r)) for r, tg in rows]
        )
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.save_pretrained(directory)
    sampled = sample_first_calls(model, renderer, samples, seed)
    record = {
        "steps": steps,
        "batch": batch,
        "lr": lr,
        "seed": seed,
        "copy_name": copy_name,
        "prefer_tool": prefer_tool,
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
        **sampled,
        "seconds": time.monotonic() - started,
        "config": {"vocab_size": config.vocab_size, **MODEL_CONFIG},
    }
    with open(os.path.join(directory, "start.json"), "w") as f:
        json.dump(record, f, indent=1)
    return record


def sample_first_calls(model: Any, renderer: Any, samples: int, seed: int) -> dict[str, float]:
    """Sample first turns for ``samples`` tasks: the share that parse as one call of a known tool
    on a branch name (``valid_call_fraction``) and the share that is the requested call
    (``correct_call_fraction``; chance is 1/12 for a model that knows the format only)."""
    import torch

    from ..tools import parse_hermes

    schemas = [t.schema() for t in branch_tools()]
    tasks = all_branch_tasks()
    gen = torch.Generator().manual_seed(seed)
    valid = correct = 0
    with torch.inference_mode():
        for i in range(samples):
            task = tasks[(i * 7) % len(tasks)]
            ids = list(renderer.prompt_ids([{"role": "user", "content": task.request}], schemas))
            start = len(ids)
            for _ in range(32):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]  # (V,)
                ids.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)))
                if ids[-1] == renderer.end_of_turn:
                    break
            calls = parse_hermes(renderer.decode(ids[start:])).calls
            call = calls[0] if len(calls) == 1 else None
            name = getattr(call, "arguments", {}).get("name")
            if getattr(call, "name", None) in {f"{v}_branch" for v in VERBS} and name in BRANCHES:
                valid += 1
                correct += (call.name, name) == (f"{task.verb}_branch", task.name)  # type: ignore[union-attr]
    return {"valid_call_fraction": valid / samples, "correct_call_fraction": correct / samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--copy-name",
        type=float,
        default=0.0,
        help="probability that a call names the request's branch (else a uniform one)",
    )
    parser.add_argument(
        "--prefer-tool",
        type=float,
        default=0.0,
        help="probability that a call uses the requested tool (else a uniform one)",
    )
    args = parser.parse_args()
    print(
        json.dumps(
            build_start(
                args.directory,
                steps=args.steps,
                seed=args.seed,
                copy_name=args.copy_name,
                prefer_tool=args.prefer_tool,
            )
        )
    )


if __name__ == "__main__":
    main()

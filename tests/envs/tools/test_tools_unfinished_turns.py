"""A tool-calling turn that never ended (its token budget ran out before the end-of-turn token) is
not a well-formed reply: its calls do not run. And a stored assistant message holds each call once."""

from __future__ import annotations

from thundersync_lightning.envs.tools import Tool, ToolConversation, ToolResult, parse_hermes

from .test_tools_calls import call, renderer, sampled


def counting_tool(ran: list[dict]) -> Tool:
    return Tool("echo", "Repeat text.", {"type": "object", "properties": {"text": {"type": "string"}}},
                lambda sandbox, args: ran.append(args) or ToolResult(args["text"]))  # fmt: skip


def test_the_calls_of_a_turn_cut_at_its_token_budget_are_refused_as_invalid_and_never_run():
    r, ran = renderer(), []
    conv = ToolConversation(r, [counting_tool(ran)])
    conv.start([{"role": "user", "content": "go"}])
    cut = sampled(r, call("echo", text="x") + "</tool_call></tool_call>")[:-1]  # no end-of-turn sampled
    turn = conv.respond(cut, sandbox=None)
    assert (turn.calls, turn.invalid, turn.done, ran) == (1, 1, False, [])
    shown = r.tokenizer.decode(turn.observation)
    assert turn.observation[0] == r.end_of_turn  # the environment closes the turn
    assert "[invalid tool call] the turn reached its token limit without its end-of-turn token" in shown
    assert "tool_calls" not in conv.messages[-2]  # the stored assistant turn made no call


def test_run_unfinished_turns_runs_the_calls_of_a_cut_turn():
    r, ran = renderer(), []
    conv = ToolConversation(r, [counting_tool(ran)], run_unfinished_turns=True)
    conv.start([{"role": "user", "content": "go"}])
    turn = conv.respond(sampled(r, call("echo", text="x"))[:-1], sandbox=None)
    assert (turn.calls, turn.invalid, ran) == (1, 0, [{"text": "x"}])


def test_a_stored_assistant_message_holds_each_call_once_and_keeps_its_reasoning():
    r, ran = renderer(), []
    conv = ToolConversation(r, [counting_tool(ran)])
    conv.start([{"role": "user", "content": "go"}])
    text = "<think>\nplan\n</think>\n\nLooking.\n" + call("echo", text="x")
    conv.respond(sampled(r, text), sandbox=None)
    message = conv.messages[1]
    assert message["content"] == "<think>\nplan\n</think>\n\nLooking."
    assert message["tool_calls"] == [
        {"type": "function", "function": {"name": "echo", "arguments": {"text": "x"}}}
    ]
    rendered = r.render_text(conv.messages, add_generation_prompt=False)
    assert rendered.count('"name": "echo", "arguments"') == 1 and "plan" in rendered


def test_the_parser_keeps_reasoning_and_its_quoted_calls_in_the_message_content():
    parsed = parse_hermes(f"<think>maybe {call('echo', text='no')}</think>Then.\n{call('echo', text='a')}")
    assert parsed.message_content == f"<think>maybe {call('echo', text='no')}</think>Then."
    assert parsed.content == "Then."

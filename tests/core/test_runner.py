"""Episode runner with scripted policies: turn order, retries, masks, growing context, prefix-stable prompts."""

from __future__ import annotations

import pytest

from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.agent.teacher import mistake_column, teacher_policy
from earl_core.engines.base import Generation
from earl_core.env.connect_four import Board
from earl_core.env.opponents import HeuristicOpponent, RandomOpponent


@pytest.fixture()
def encoder(protocol_tokenizer) -> ChatEncoder:  # noqa: ANN001
    return ChatEncoder(protocol_tokenizer)


def _answer(encoder: ChatEncoder, text: str, *, close: bool = True) -> Generation:
    ids = encoder.tokenizer.encode(text, add_special_tokens=False) + ([encoder.im_end] if close else [])
    return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop" if close else "length")


def test_teacher_games_finish_with_consistent_records(encoder: ChatEncoder) -> None:
    specs = [GameSpec(index=i, group=0, agent_side=1 + i % 2, opponent=RandomOpponent(), seed=i) for i in range(20)]
    eps = play_episodes(specs, teacher_policy(HeuristicOpponent(), encoder), encoder, limits=RunnerLimits())
    assert [e.index for e in eps] == list(range(20))
    wins = sum(e.result == "win" for e in eps)
    assert wins >= 16, "heuristic teacher should beat random nearly always"
    for e in eps:
        rec = e.record()
        assert len(rec["token_ids"]) == len(rec["action_mask"]) == len(rec["logprobs"])
        assert rec["turn_context"] == sorted(set(rec["turn_context"])), "context grows every turn"
        agent_moves = [m for m in rec["moves"] if m["player"] == "agent"]
        assert len(agent_moves) == len(rec["turn_context"])
        # Trained tokens are exactly the answers: "[col N]" + <|im_end|> per agent turn.
        answer_len = len(encoder.tokenizer.encode("[col 3]", add_special_tokens=False)) + 1
        assert sum(rec["action_mask"]) == answer_len * len(agent_moves)
        assert rec["reward"] == {"win": 1.0, "loss": -1.0, "draw": 0.0}[rec["result"]]
        first_mover = rec["moves"][0]["player"]
        assert first_mover == ("agent" if e.agent_side == 1 else "opponent")


def test_each_prompt_extends_the_previous_one(encoder: ChatEncoder) -> None:
    prompts: list[list[int]] = []

    def policy(waiting: list[Episode]) -> list[Generation]:
        prompts.append(list(waiting[0].conversation.token_ids))
        col = waiting[0].board.legal_columns()[0]
        return [_answer(encoder, protocol.answer_text(col))]

    play_episodes([GameSpec(0, 0, 1, RandomOpponent(), 3)], policy, encoder, limits=RunnerLimits())
    assert len(prompts) >= 4
    for short, long in zip(prompts, prompts[1:]):
        assert long[: len(short)] == short and len(long) > len(short)


def test_invalid_answer_gets_one_retry_then_loses(encoder: ChatEncoder) -> None:
    seen: list[str] = []

    def policy(waiting: list[Episode]) -> list[Generation]:
        seen.append(encoder.tokenizer.decode(waiting[0].conversation.token_ids))
        return [_answer(encoder, "hmm", close=False)]

    limits = RunnerLimits(max_invalid=1, format_penalty=0.1)
    (ep,) = play_episodes([GameSpec(0, 0, 1, RandomOpponent(), 0)], policy, encoder, limits=limits)
    assert len(seen) == 2 and "Invalid move: no [col N] found" in seen[1]
    assert ep.result == "loss" and ep.end_reason.startswith("invalid answer")
    assert ep.invalid == 2 and ep.reward == pytest.approx(-1.2)
    # Each unfinished answer was closed with an <|im_end|> the agent did not write: context, not trained on.
    conv = ep.conversation
    ends = [i for i in range(1, len(conv)) if conv.action_mask[i - 1] == 1 and conv.action_mask[i] == 0]
    assert len(ends) == 2
    for i in ends:
        assert conv.token_ids[i] == encoder.im_end and conv.action_mask[i] == 0


def test_retry_allowance_is_per_turn(encoder: ChatEncoder) -> None:
    calls = {"n": 0}

    def policy(waiting: list[Episode]) -> list[Generation]:
        calls["n"] += 1
        if calls["n"] % 2 == 1:  # every turn: first answer invalid, then a legal one
            return [_answer(encoder, "[col 9]")]
        return [_answer(encoder, protocol.answer_text(waiting[0].board.legal_columns()[0]))]

    (ep,) = play_episodes([GameSpec(0, 0, 1, RandomOpponent(), 1)], policy, encoder, limits=RunnerLimits(max_invalid=1))
    assert ep.invalid >= 2 and ep.end_reason in ("four in a row", "board full")


def test_context_limit_ends_game(encoder: ChatEncoder) -> None:
    policy = teacher_policy(RandomOpponent(), encoder)
    (ep,) = play_episodes([GameSpec(0, 0, 1, RandomOpponent(), 0)], policy, encoder,
                          limits=RunnerLimits(max_context=400, max_new_tokens=16))
    assert ep.result == "loss" and ep.end_reason == "context limit reached"
    assert len(ep.conversation) + 16 > 400
    assert len(ep.turn_context) == sum(m.player == "agent" for m in ep.moves), "unanswered turn not counted"


def test_teacher_mistakes_are_context_not_targets_and_the_retry_recovers(encoder: ChatEncoder) -> None:
    specs = [GameSpec(index=i, group=i, agent_side=1 + i % 2, opponent=HeuristicOpponent(), seed=i) for i in range(6)]
    eps = play_episodes(specs, teacher_policy(HeuristicOpponent(), encoder, mistake_rate=1.0), encoder,
                        limits=RunnerLimits())
    mistakes = repeats = 0
    for ep in eps:
        assert ep.end_reason != "" and not ep.end_reason.startswith("invalid")  # every mistake was recovered
        rec = ep.record()
        answers = [m for m in rec["moves"] if m["player"] == "agent"]
        for before, after in zip(answers, answers[1:]):
            if before["column"] is None:
                mistakes += 1
                assert after["column"] is not None  # the retry is the teacher's real move
        # Each mistake names the column of the agent's previous answer where that one is full now.
        board, previous = Board(), None
        for m in rec["moves"]:
            if m["column"] is None:
                wrong = mistake_column(board, previous)
                assert m["text"] == protocol.answer_text(wrong)
                repeats += wrong == previous != mistake_column(board, None)  # not the most central full column
                continue
            board = board.drop(m["column"])
            if m["player"] == "agent":
                previous = m["column"]
        # tokens of wrong answers are masked out; each valid answer's tokens are targets
        targets = sum(rec["action_mask"])
        valid = sum(1 for m in answers if m["column"] is not None)
        per_answer = len(encoder.tokenizer.encode(protocol.answer_text(3), add_special_tokens=False)) + 1
        assert targets == valid * per_answer
    assert mistakes > 0  # heuristic games fill the centre column, so mistakes did happen
    assert repeats > 0  # and some repeat a previous answer that is not the most central full column


def test_the_board_format_reaches_every_prompt(encoder: ChatEncoder) -> None:
    specs = [GameSpec(index=i, group=0, agent_side=1 + i % 2, opponent=RandomOpponent(), seed=i) for i in range(4)]
    eps = play_episodes(specs, teacher_policy(HeuristicOpponent(), encoder), encoder,
                        limits=RunnerLimits(board_format="cells"))
    for ep in eps:
        text = encoder.tokenizer.decode(ep.conversation.token_ids)
        assert "one word per cell" in text and "0 1 2 3 4 5 6" not in text  # no rows header anywhere
        # One board per agent turn, each in cells (the bottom-left cell's word starts with "aa").
        turns = len(ep.record()["turn_context"])
        assert sum(line.startswith("aa") for line in text.split("\n")) == turns

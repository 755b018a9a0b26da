import pytest

from serving.server.text import TextAssembler


class ByteTokenizer:
    """Each token id is one piece of UTF-8 bytes; decoding joins and decodes them, so a
    multi-byte character split across tokens decodes to U+FFFD until it is complete."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def feed(assembler: TextAssembler, ids: list[int]) -> list[str]:
    return [assembler.add(i) for i in ids]


def test_text_is_released_token_by_token_without_stops():
    tokenizer = ByteTokenizer([b"Hel", b"lo", b" world"])
    assembler = TextAssembler(tokenizer)
    assert feed(assembler, [0, 1, 2]) == ["Hel", "lo", " world"]
    assert assembler.finish() == ""
    assert assembler.text == "Hello world"


def test_an_incomplete_utf8_character_is_held_back():
    e_acute = "é".encode()
    tokenizer = ByteTokenizer([b"caf", e_acute[:1], e_acute[1:], b"!"])
    assembler = TextAssembler(tokenizer)
    assert feed(assembler, [0, 1, 2, 3]) == ["caf", "", "é", "!"]
    assert assembler.text == "café!"


def test_a_stop_sequence_across_tokens_cuts_the_text_before_it():
    tokenizer = ByteTokenizer([b"one ", b"two", b" EN", b"D three"])
    assembler = TextAssembler(tokenizer, ["END"])
    deltas = feed(assembler, [0, 1, 2, 3])
    # "EN" could begin "END": held back, then dropped with the stop.
    assert deltas == ["one ", "two", " ", ""]
    assert assembler.stopped
    assert assembler.text == "one two "
    assert assembler.add(0) == "" and assembler.finish() == ""


def test_a_held_back_prefix_that_does_not_become_a_stop_is_released():
    tokenizer = ByteTokenizer([b"a E", b"NVY", b"x"])
    assembler = TextAssembler(tokenizer, ["END"])
    assert feed(assembler, [0, 1]) == ["a ", "ENVY"]
    assert not assembler.stopped
    assert assembler.add(2) == "x"


def test_held_back_text_is_released_when_the_request_ends():
    tokenizer = ByteTokenizer([b"done E"])
    assembler = TextAssembler(tokenizer, ["END"])
    assert assembler.add(0) == "done "
    assert assembler.finish() == "E"
    assert assembler.text == "done E"


@pytest.mark.parametrize("stops", [["b"], ["zz", "b"], ["b", "bc"]])
def test_the_earliest_stop_wins(stops):
    tokenizer = ByteTokenizer([b"abc"])
    assembler = TextAssembler(tokenizer, stops)
    assert assembler.add(0) == "a"
    assert assembler.stopped

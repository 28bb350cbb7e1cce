"""Forced alignment of ASR words to audio. No protocol code here.

Default engine: pocketsphinx (the en-us model and cmudict ship in its PyPI wheel). What it takes
to make it reliable:
- align per ASR segment, not the whole file (its cost grows superlinearly with length);
- pad each piece with ~0.5 s of low-level noise on both ends and subtract it afterwards (it
  otherwise clips the first and last words);
- retry a fixed list of beam settings: the defaults fail on telephone audio, very wide beams
  (1e-80) work there, and success is not monotonic in beam width;
- accept a result only when every word came back (it can return a partial alignment silently);
- dither the audio by about one 16-bit step: digital silence (exact zeros) makes whole
  segments fail;
- add out-of-vocabulary words with a letter-to-phone pronunciation;
- a stretch that does not align (overlapped speech, one misheard word) is cut in two at the
  widest pause between the ASR's words and each half aligned alone, twice over at most;
- words that still fail keep the ASR's own timestamps, marked `aligned: false`.
Production engine: torchaudio's MMS forced-alignment bundle (wav2vec2 CTC) on CUDA.
"""

from __future__ import annotations

import wave

import numpy as np

from .text import letter_to_phones, normalize
from .words import placed, result, segment

RATE = 16000
PAD_S = 0.5
MARGIN_S = 0.15
SPLIT_DEPTH = 2  # a stretch that does not align is halved at most this many times over
# Beam settings tried on a half before it is halved again. A whole segment and a last piece get
# all of them: a segment that aligns whole with any setting is never cut.
FIRST_TRIES = 1
FRAME_S = 0.01
# (beam, wbeam, pbeam); tried in order until one aligns every word.
BEAMS = [
    (1e-48, 7e-29, 1e-48),
    (1e-80, 1e-60, 1e-80),
    (1e-64, 1e-40, 1e-64),
    (1e-100, 1e-80, 1e-100),
]


def read_wav(path: str) -> np.ndarray:
    with wave.open(path) as w:
        if w.getframerate() != RATE or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16 kHz mono PCM16 (gpuhost normalizes uploads)")
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


class SphinxAligner:
    name = "pocketsphinx en-us"
    languages = ("en",)
    device = "cpu"

    def __init__(self, beams=BEAMS):
        self._beams = list(beams)
        self._decoders = [_decoder(b) for b in self._beams]
        self._rng = np.random.default_rng(0)
        # The setting that aligned the last piece goes first: a recording's channel does not change.
        self._preferred = 0
        # The decoder whose utterance a cancelled task left open, if one did.
        self._open = None

    def _ensure_words(self, tokens):
        # In a fixed order: the order words join the dictionary can tip the decoder's ties.
        for t in sorted(set(tokens)):
            for d in self._decoders:
                if d.lookup_word(t) is None:
                    # No search update: set_align_text builds a new search from the dictionary
                    # anyway, and updating costs ~0.13 s per word and decoder.
                    d.add_word(t, letter_to_phones(t), False)

    def _align_piece(self, audio: np.ndarray, tokens: list, tries: int | None = None):
        """Word (start, end) per token in seconds relative to `audio`, or None. `tries`:
        how many beam settings to try (all when None), the last one that worked first."""
        noise_level = max(4.0, float(np.percentile(np.abs(audio), 10)) if audio.size else 4.0)
        pad = (self._rng.standard_normal(int(PAD_S * RATE)) * noise_level).astype(np.int16)
        padded = np.concatenate([pad, _dithered(audio, self._rng), pad]).tobytes()
        text = " ".join(tokens)
        order = [self._preferred] + [i for i in range(len(self._decoders)) if i != self._preferred]
        for i in order[:tries]:
            decoder = self._decoders[i]
            # Until the utterance has ended: a task called off in between (the SDK's
            # `TaskCancelled`, raised wherever the code is) leaves it open (see `align`).
            self._open = i
            try:
                _decode(decoder, text, padded)
            except RuntimeError:
                self._open = None
                decoder.reinit_feat()  # a failed utterance leaves state behind (see `align`)
                continue
            self._open = None
            words = [
                s
                for s in (decoder.seg() or [])
                if s.word not in ("<s>", "</s>", "<sil>") and not s.word.startswith("[")
            ]
            names = [s.word.split("(")[0] for s in words]
            if names != tokens:
                decoder.reinit_feat()
                continue  # partial alignment: try the next beam setting
            self._preferred = i
            return [
                (s.start_frame * FRAME_S - PAD_S, (s.end_frame + 1) * FRAME_S - PAD_S)
                for s in words
            ]
        return None

    def _word_times(self, audio: np.ndarray, words: list, start: float, end: float, depth=0):
        """(start, end) in seconds of the recording for each ASR word of `audio[start:end]`,
        None for a word left unaligned. A stretch whose words do not all align is cut in two at
        the widest pause between the ASR's words and each half aligned alone (at most
        `SPLIT_DEPTH` times over): overlapped speech or one misheard word then costs only its
        own half, not the whole segment."""
        # Words Whisper wrote joined ("50" "%", "$1" ",200") are said as one: normalized together.
        groups = _written(words)
        tokens_per_group = [normalize("".join(words[i]["word"] for i in g)) for g in groups]
        tokens = [t for ts in tokens_per_group for t in ts]
        if not tokens or end - start < FRAME_S * 10:
            return [None] * len(words)
        self._ensure_words(tokens)
        leaf = depth >= SPLIT_DEPTH or len(words) < 2
        piece = audio[int(start * RATE) : int(end * RATE)]
        timing = self._align_piece(piece, tokens, None if leaf or depth == 0 else FIRST_TRIES)
        if timing is None:
            if leaf:
                return [None] * len(words)
            i = _cut_after(words)
            cut = min(max((words[i]["end"] + words[i + 1]["start"]) / 2, start), end)
            return self._word_times(
                audio, words[: i + 1], start, min(end, cut + MARGIN_S), depth + 1
            ) + self._word_times(audio, words[i + 1 :], max(start, cut - MARGIN_S), end, depth + 1)
        out, k = [None] * len(words), 0
        for group, ts in zip(groups, tokens_per_group):
            if not ts:
                continue
            first, last = timing[k], timing[k + len(ts) - 1]
            k += len(ts)
            span = (start + max(first[0], 0.0), start + max(last[1], first[0] + FRAME_S))
            for i, (a, b) in zip(group, _shares([words[i]["word"] for i in group], *span)):
                out[i] = (a, b)
        return out

    def align(self, audio: np.ndarray, segments: list, progress=None) -> dict:
        """Every ASR segment aligned (its words' times), `progress(done, of)` after each. The
        same request gets the same times whatever the worker aligned before it: the preferred
        beam setting and the padding noise start afresh, and so does each decoder's feature
        extraction (after a failed alignment it held state that moved the next request's word
        boundaries by tens of ms in about one process of three). The out-of-vocabulary words it
        learned stay in its dictionary."""
        self._preferred = 0
        self._rng = np.random.default_rng(0)
        if self._open is not None:
            # Called off mid-utterance: that decoder refuses every alignment from then on (and
            # ending its utterance late can crash it), which moved later requests' words by
            # seconds while they still read as aligned. A new one in its place (~0.3 s).
            self._decoders[self._open] = _decoder(self._beams[self._open])
            self._open = None
        for decoder in self._decoders:
            decoder.reinit_feat()
        out_segments = []
        for i, seg in enumerate(segments):
            asr_words = seg.get("words") or []
            start = max(0.0, seg["start"] - MARGIN_S)
            end = min(len(audio) / RATE, seg["end"] + MARGIN_S)
            words = []
            for w, t in zip(asr_words, self._word_times(audio, asr_words, start, end)):
                if t is None:
                    words.append(placed(w, w["start"], w["end"], w.get("probability", 0.0), False))
                else:
                    # pocketsphinx scores nothing in alignment (every placed word's probability
                    # is 0, which read as 1.0): the ASR's probability is the word's score.
                    words.append(placed(w, t[0], t[1], w.get("probability", 0.0), True))
            out_segments.append(segment(seg, words))
            if progress:
                progress(i + 1, len(segments))
        return result(self.name, out_segments, len(audio) / RATE)


def _decoder(beams):
    """A pocketsphinx decoder with these (beam, wbeam, pbeam)."""
    from pocketsphinx import Decoder

    config = Decoder.default_config()
    config["beam"], config["wbeam"], config["pbeam"] = beams
    config["loglevel"] = "FATAL"
    return Decoder(config)


def _decode(decoder, text: str, padded: bytes) -> None:
    """One utterance: `padded` aligned to `text` (RuntimeError when it does not align)."""
    decoder.set_align_text(text)
    decoder.start_utt()
    decoder.process_raw(padded, full_utt=True)
    decoder.end_utt()


def _dithered(audio: np.ndarray, rng) -> np.ndarray:
    """`audio` with noise of about one 16-bit step added (90 dB below full scale). Stretches of
    digital silence (exact zeros: synthesized speech, a noise gate, the silent parts of a video)
    give pocketsphinx's features the log of zero, and whole segments then fail to align: the
    README's espeak-ng example, resampled by ffmpeg, aligned 2 of its 5 words. Sphinx's own
    `dither` option does this, but from a generator that runs on across requests; this one is the
    request's (reset in `align`), so the same request still gets the same times."""
    noisy = audio.astype(np.float32) + rng.standard_normal(audio.size, dtype=np.float32)
    return np.clip(np.rint(noisy), -32768, 32767).astype(np.int16)


def _written(words: list) -> list:
    """The indices of `words` grouped as written: a word the ASR marks `joined` (no space
    before it) belongs with the one before."""
    groups = []
    for i, w in enumerate(words):
        if groups and w.get("joined"):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _shares(texts: list, start: float, end: float) -> list:
    """`[start, end]` split among the pieces of one written word by their length."""
    weights = [max(1, len(t)) for t in texts]
    total, at, out = sum(weights), start, []
    for w in weights:
        step = (end - start) * w / total
        out.append((round(at, 3), round(at + step, 3)))
        at += step
    return out


def _cut_after(words: list) -> int:
    """Where to halve a stretch that did not align: after the word followed by the widest pause
    in the ASR's times, the middle of the stretch among equal ones (rounded to 10 ms: Whisper's
    words mostly touch, and a cut after the first word would only peel words off the front).
    Never inside a word written joined ("50" "%"): its pieces are said as one."""
    middle = (len(words) - 2) / 2
    gaps = [round(words[i + 1]["start"] - words[i]["end"], 2) for i in range(len(words) - 1)]
    cuts = [i for i in range(len(gaps)) if not words[i + 1].get("joined")] or list(range(len(gaps)))
    return max(cuts, key=lambda i: (gaps[i], -abs(i - middle)))


class MmsAligner:
    """wav2vec2 CTC forced alignment (torchaudio MMS_FA) for CUDA machines."""

    name = "torchaudio MMS_FA"

    def __init__(self, device: str = "cuda"):
        import torch
        import torchaudio

        self.torch, self.device = torch, device
        self.bundle = torchaudio.pipelines.MMS_FA
        self.model = self.bundle.get_model(with_star=False).to(device)
        self.tokenizer, self.aligner = self.bundle.get_tokenizer(), self.bundle.get_aligner()

    def align(self, audio: np.ndarray, segments: list, progress=None) -> dict:
        torch = self.torch
        out_segments = []
        for i, seg in enumerate(segments):
            asr_words = seg.get("words") or []
            tokens = [" ".join(normalize(w["word"])).replace(" ", "") for w in asr_words]
            start = max(0.0, seg["start"] - MARGIN_S)
            piece = (
                audio[int(start * RATE) : int((seg["end"] + MARGIN_S) * RATE)].astype(np.float32)
                / 32768.0
            )
            words = []
            keep = [t for t in tokens if t]
            spans = None
            if keep:
                with torch.inference_mode():
                    emission, _ = self.model(torch.from_numpy(piece)[None].to(self.device))
                    spans = self.aligner(emission[0], self.tokenizer(keep))
                ratio = piece.shape[0] / emission.shape[1] / RATE
            it = iter(spans or [])
            for w, t in zip(asr_words, tokens):
                span = next(it) if (t and spans) else None
                if span:
                    score = round(float(sum(s.score for s in span) / len(span)), 4)
                    a, b = start + span[0].start * ratio, start + span[-1].end * ratio
                    words.append(placed(w, a, b, score, True))
                else:
                    words.append(placed(w, w["start"], w["end"], w.get("probability", 0.0), False))
            out_segments.append(segment(seg, words))
            if progress:
                progress(i + 1, len(segments))
        return result(self.name, out_segments, len(audio) / RATE)


def load(engine: str, options: dict):
    if engine in ("pocketsphinx", "cpu"):
        return SphinxAligner()
    if engine in ("mms", "cuda"):
        return MmsAligner(device=options.get("device", "cuda"))
    raise ValueError(f"unknown aligner engine {engine!r} (pocketsphinx, mms)")

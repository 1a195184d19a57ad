"""The speech engine: real eSpeak NG audio, not silence, in two voices a pitch tracker tells apart."""

from __future__ import annotations

import array
import wave
from pathlib import Path

import numpy as np

from iris_rag.podcast.speech import GUEST, HOST, engine, rms, silence, write_wav

SENTENCE = "The moon pulls the sea, and twice a day the tide comes in across the sand."


def median_pitch_hz(samples: array.array[int], rate: int) -> float:
    """The median fundamental frequency of the voiced 40 ms frames, by autocorrelation (60-400 Hz)."""
    signal = np.frombuffer(samples.tobytes(), dtype=np.int16).astype(np.float64)
    frame = int(0.04 * rate)
    shortest, longest = rate // 400, rate // 60
    loud = 0.5 * rms(samples)
    pitches = []
    for start in range(0, len(signal) - frame, frame):
        window = signal[start : start + frame]
        if np.sqrt(np.mean(window * window)) < loud:
            continue
        window = window - window.mean()
        correlation = np.correlate(window, window, mode="full")[frame - 1 :]
        lag = shortest + int(np.argmax(correlation[shortest:longest]))
        if correlation[lag] > 0.3 * correlation[0]:
            pitches.append(rate / lag)
    assert len(pitches) > 10, "too few voiced frames to measure a pitch"
    return float(np.median(pitches))


def test_speech_is_real_audio_of_a_plausible_length() -> None:
    speech = engine()
    samples = speech.synthesize(SENTENCE, HOST)
    seconds = len(samples) / speech.sample_rate
    words = len(SENTENCE.split())
    # 16 words at 165 words a minute is about 6 s; eSpeak's pauses make it a little longer.
    assert 0.6 * words / HOST.rate * 60 < seconds < 1.6 * words / HOST.rate * 60, seconds
    assert rms(samples) > 500, "silence"
    assert rms(silence(1.0, speech.sample_rate)) == 0


def test_the_two_voices_differ_in_pitch() -> None:
    speech = engine()
    host = median_pitch_hz(speech.synthesize(SENTENCE, HOST), speech.sample_rate)
    guest = median_pitch_hz(speech.synthesize(SENTENCE, GUEST), speech.sample_rate)
    assert guest > 1.3 * host, (host, guest)


def test_wav_files_are_written_whole(tmp_path: Path) -> None:
    speech = engine()
    samples = speech.synthesize("Hello.", GUEST)
    path = tmp_path / "hello.wav"
    write_wav(path, samples, speech.sample_rate)
    with wave.open(str(path)) as read:
        assert (read.getnchannels(), read.getsampwidth(), read.getframerate()) == (1, 2, speech.sample_rate)
        assert read.getnframes() == len(samples)
    assert not path.with_suffix(".part").exists()

"""Offline speech: the eSpeak NG library, driven through ctypes, to 16-bit mono PCM.

The library and its voice data come from the `espeakng-loader` wheel (a runtime dependency); where the wheel
is missing, the system's libespeak-ng (Debian's `espeak-ng` package, installed in the container) is used.
eSpeak NG keeps one global synthesizer per process, so every call holds one lock, and the library is
initialised once, on first use.
"""

from __future__ import annotations

import array
import ctypes
import ctypes.util
import importlib
import math
import threading
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iris_rag.errors import ModelUnavailableError

# espeak_AUDIO_OUTPUT: AUDIO_OUTPUT_SYNCHRONOUS returns from espeak_Synth once the text is spoken.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
# espeak_PARAMETER
_RATE = 1
_PITCH = 3
_RANGE = 4
_POSITION_CHARACTER = 1
_CHARS_UTF8 = 1
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


@dataclass(frozen=True, slots=True)
class Voice:
    """One speaker: an eSpeak NG voice (language+variant), its pitch (0-100) and rate (words per minute)."""

    speaker: str
    name: str
    pitch: int
    rate: int

    def describe(self) -> dict[str, Any]:
        """The voice as a response reports it."""
        return {"speaker": self.speaker, "voice": self.name, "pitch": self.pitch, "rate_wpm": self.rate}


# Two voices a listener tells apart: a low male American voice and a high female British one.
HOST = Voice("host", "en-us", pitch=35, rate=165)
GUEST = Voice("guest", "en+f3", pitch=70, rate=160)


def _load_library() -> tuple[Any, bytes | None]:
    """The library and its data folder: the espeakng-loader wheel's, else the system's."""
    loader: Any
    try:
        loader = importlib.import_module("espeakng_loader")
    except ImportError:
        loader = None
    if loader is not None:
        library = Path(loader.get_library_path())
        if library.exists():
            return ctypes.CDLL(str(library)), str(loader.get_data_path()).encode()
    found = ctypes.util.find_library("espeak-ng")
    if found is None:
        msg = (
            "no speech engine: install the espeakng-loader wheel (pip install espeakng-loader) or the "
            "espeak-ng system package"
        )
        raise ModelUnavailableError(msg)
    return ctypes.CDLL(found), None


class SpeechEngine:
    """Speaks text in a voice and returns its samples; one per process (see `engine()`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._library, data_path = _load_library()
        library = self._library
        library.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        library.espeak_Initialize.restype = ctypes.c_int
        library.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        library.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        library.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
        library.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        rate = library.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, 0)
        if rate <= 0:
            msg = f"the eSpeak NG library failed to initialise (code {rate})"
            raise ModelUnavailableError(msg)
        self.sample_rate: int = rate
        self._samples = array.array("h")
        # Kept on the instance: the library calls it for as long as the process lives.
        self._callback = _SYNTH_CALLBACK(self._collect)
        library.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav: Any, count: int, _events: Any) -> int:
        if count > 0:
            self._samples.frombytes(ctypes.string_at(wav, count * 2))
        return 0  # 0: go on

    def synthesize(self, text: str, voice: Voice) -> array.array[int]:
        """The text spoken in the voice, as 16-bit samples at `sample_rate`."""
        # A lone surrogate (JSON allows one) has no UTF-8 form: it is spoken as nothing.
        data = text.encode("utf-8", errors="ignore") + b"\0"
        with self._lock:
            library = self._library
            if library.espeak_SetVoiceByName(voice.name.encode()) != 0:
                msg = f"eSpeak NG has no voice {voice.name!r}"
                raise ModelUnavailableError(msg)
            library.espeak_SetParameter(_RATE, voice.rate, 0)
            library.espeak_SetParameter(_PITCH, voice.pitch, 0)
            library.espeak_SetParameter(_RANGE, 50, 0)
            self._samples = array.array("h")
            status = library.espeak_Synth(data, len(data), 0, _POSITION_CHARACTER, 0, _CHARS_UTF8, None, None)
            samples, self._samples = self._samples, array.array("h")
        if status != 0:
            msg = f"eSpeak NG could not speak the text (code {status})"
            raise ModelUnavailableError(msg)
        return samples


_engine: SpeechEngine | None = None
_engine_lock = threading.Lock()


def engine() -> SpeechEngine:
    """The process's speech engine, loaded on first use."""
    global _engine  # one synthesizer per process: the library's own rule
    with _engine_lock:
        if _engine is None:
            _engine = SpeechEngine()
        return _engine


def silence(seconds: float, sample_rate: int) -> array.array[int]:
    """A pause of this length."""
    return array.array("h", bytes(2 * round(seconds * sample_rate)))


def write_wav(path: Path, samples: array.array[int], sample_rate: int) -> None:
    """Write mono 16-bit PCM as a WAV file (written aside, then renamed, so no reader sees half a file)."""
    partial = path.with_suffix(".part")
    with wave.open(str(partial), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(samples.tobytes())
    partial.replace(path)


def rms(samples: array.array[int]) -> float:
    """Root mean square amplitude (0 for silence; speech is in the thousands)."""
    if not samples:
        return 0.0
    values = np.frombuffer(samples.tobytes(), dtype=np.int16).astype(np.float64)
    return math.sqrt(float(np.mean(values * values)))

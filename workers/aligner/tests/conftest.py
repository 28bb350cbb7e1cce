import pytest
from gpuhost_worker.testing import speech_wav as make_speech
from gpuhost_worker.testing import start_worker  # noqa: F401  (used by the tests)


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory):
    """'hello world this is a test of the speech worker' as 16 kHz mono PCM16."""
    return make_speech(
        "hello world, this is a test of the speech worker", tmp_path_factory.mktemp("speech")
    )

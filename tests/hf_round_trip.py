"""A HuggingFace model through tools/checkpoint/convert.py and back (HF -> ours -> HF), for the conversion tests."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def convert_module():
    spec = importlib.util.spec_from_file_location("convert", os.path.join(REPO, "tools", "checkpoint", "convert.py"))
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    return convert


def round_trip(tmp_path, hf, cls):
    """(the state dict cls.from_pretrained reads back after HF -> ours -> HF, hf's own state dict)."""
    hf.save_pretrained(tmp_path / "hf")
    convert = convert_module()
    assert convert.main(["--loader", "hf", "--saver", "megatron", "--load-dir", str(tmp_path / "hf"),
                         "--save-dir", str(tmp_path / "ours")]) == 0
    assert convert.main(["--loader", "megatron", "--saver", "hf", "--load-dir", str(tmp_path / "ours"),
                         "--save-dir", str(tmp_path / "back")]) == 0
    return cls.from_pretrained(tmp_path / "back").state_dict(), hf.state_dict()

"""Operand quantizers typed by scaling mode (numerics.operand_quant).

Each mode is its own class holding only its options, so a bad mix cannot be built;
``OperandQuant`` is only their base, and ``replace`` keeps the class.
"""

import dataclasses
import pickle

import pytest

from lowprec.numerics import operand_quant as oq
from lowprec.numerics import recipes
from lowprec.numerics.rounding import Nearest, Stochastic

def _builtin_operands():
  return [(f"{name}/{g}/{side}", op) for name in recipes.names()
          for g, gemm in zip(recipes.GEMM_NAMES, recipes.get(name).gemms)
          for side, op in (("lhs", gemm.lhs), ("rhs", gemm.rhs)) if op is not None]


def test_the_base_class_is_not_an_operand_quantizer():
  """The single-class constructor of earlier releases is gone (no shim): one line
  naming the four classes."""
  with pytest.raises(TypeError, match="OperandQuant is the base class: build an "
                     "MXQuant, NVFP4Quant, TensorQuant or DelayedQuant"):
    recipes.OperandQuant("e4m3", scaling="tensor")
  assert isinstance(oq.TensorQuant("e4m3"), recipes.OperandQuant)


@pytest.mark.parametrize("kind,kwargs", [
    (oq.NVFP4Quant, dict(scale_rule="ceil")),
    (oq.NVFP4Quant, dict(clip="rms")),
    (oq.NVFP4Quant, dict(fmt="e2m1")),
    (oq.TensorQuant, dict(fmt="e4m3", block_shape=32)),
    (oq.TensorQuant, dict(fmt="e4m3", margin=1)),
    (oq.DelayedQuant, dict(fmt="e4m3", amax_axis_name="data")),
    (oq.MXQuant, dict(fmt="e4m3", convention="te")),
    (oq.MXQuant, dict(fmt="e4m3", amax_history_len=8)),
])
def test_a_mode_has_no_argument_for_another_modes_option(kind, kwargs):
  with pytest.raises(TypeError, match="unexpected keyword argument"):
    kind(**kwargs)


def test_options_a_mode_lacks_read_as_neutral_values():
  nv, t, d = oq.NVFP4Quant(), oq.TensorQuant("e4m3"), oq.DelayedQuant("e5m2")
  assert (nv.fmt, nv.scaling, nv.block_shape, nv.scale_rule, nv.clip, nv.macro_block,
          nv.amax_history_len) == ("nvfp4", "block", 16, "floor", "none", None, 1024)
  assert (t.scaling, t.block_shape, t.block_extents, t.convention, t.margin) == (
      "tensor", None, (), "te", 0)
  assert (d.scaling, d.amax_axis_name, d.clip, d.prescale) == ("delayed", None, "none", 1.0)
  with pytest.raises(dataclasses.FrozenInstanceError):
    nv.rounding = "stochastic"


def test_each_mode_validates_its_own_options():
  with pytest.raises(ValueError, match="nvfp4 operands are NVFP4Quant"):
    oq.MXQuant("nvfp4")
  with pytest.raises(ValueError, match="block scaling needs an MX element format"):
    oq.MXQuant("bf16")
  with pytest.raises(ValueError, match="nvfp4 blocks are 16 long"):
    oq.NVFP4Quant(block_shape=(16, 32))
  with pytest.raises(ValueError, match="nvfp4 is block-scaled"):
    oq.TensorQuant("nvfp4")
  with pytest.raises(ValueError, match="unknown format 'e9m9'"):
    oq.DelayedQuant("e9m9")
  with pytest.raises(TypeError, match="rounding must be Nearest"):
    oq.TensorQuant("e4m3", rounding="stochastic")
  with pytest.raises(ValueError, match="margin must be an int >= 0"):
    oq.DelayedQuant("e4m3", margin=-1)


@pytest.mark.parametrize("op,changes,message", [
    (oq.NVFP4Quant(), dict(scale_rule="ceil"), r"nvfp4 has no MX scale rule"),
    (oq.TensorQuant("e4m3"), dict(scale_rule="ceil"),
     r"scale_rule is an MX option \(MXQuant\), not TensorQuant's"),
    (oq.DelayedQuant("e4m3"), dict(block_shape=32),
     r"block_shape describes blocks, which DelayedQuant has none of"),
    (oq.MXQuant("e4m3"), dict(convention="torchao"), r"convention is an nvfp4 option"),
    (oq.MXQuant("e4m3"), dict(amax_axis_name="d"), r"amax_axis_name reduces a tensor amax"),
    (oq.NVFP4Quant(), dict(macro_block=64), r"clip and macro_block apply to MX block"),
    (oq.TensorQuant("e4m3"), dict(margin=2), r"margin is a delayed-scaling option"),
    (oq.TensorQuant("e4m3"), dict(scaling="delayed"), r"scaling picks the class"),
    (oq.MXQuant("e4m3"), dict(blocks=32), r"MXQuant has no option 'blocks'"),
])
def test_replace_names_an_option_the_class_does_not_take(op, changes, message):
  with pytest.raises(ValueError, match=message):
    oq.replace(op, **changes)


def test_replace_keeps_the_class_and_validates():
  op = oq.MXQuant("e4m3", scale_rule="rceil")
  assert oq.replace(op, clip="rms") == oq.MXQuant("e4m3", scale_rule="rceil", clip="rms")
  assert oq.replace(op, fmt="e2m1") == oq.MXQuant("e2m1", scale_rule="rceil")
  # A foreign option at its neutral value is no change (transforms map over all).
  assert oq.replace(oq.NVFP4Quant(), clip="none", prescale=0.5) == oq.NVFP4Quant(
      prescale=0.5)
  with pytest.raises(ValueError, match="positive ints"):
    oq.replace(op, block_shape=-32)
  with pytest.raises(TypeError, match="op must be an OperandQuant"):
    oq.replace({"fmt": "e4m3"}, clip="rms")


def test_builtin_recipes_hold_the_typed_classes_and_pickle():
  kinds = {name: type(op) for name, op in _builtin_operands()}
  assert kinds["mxfp8/forward/lhs"] is oq.MXQuant
  assert kinds["mxfp4/wgrad/rhs"] is oq.MXQuant
  assert kinds["nvfp4/dgrad/lhs"] is oq.NVFP4Quant
  assert kinds["fp8/forward/rhs"] is oq.TensorQuant
  assert kinds["fp8_delayed/wgrad/rhs"] is oq.DelayedQuant
  for name, op in _builtin_operands():
    assert pickle.loads(pickle.dumps(op)) == op, name


def test_recipe_transforms_follow_the_operand_modes():
  assert recipes.with_amax_axis_name("fp8", "data").forward.lhs == oq.TensorQuant(
      "e4m3", amax_axis_name="data")
  assert recipes.with_amax_axis_name("mxfp8", "data").forward.lhs == recipes.get(
      "mxfp8").forward.lhs  # MX has no tensor amax
  with pytest.raises(ValueError, match="clip and macro_block apply to MX block"):
    recipes.with_dynamic_clipping("nvfp4")
  with pytest.raises(ValueError, match="DGE needs an MX float forward weight"):
    recipes.with_dge("nvfp4")

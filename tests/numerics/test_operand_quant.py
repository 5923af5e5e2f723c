"""Operand quantizers typed by scaling mode (numerics.operand_quant).

Each mode is its own class holding only its options, so a bad mix cannot be built; the
earlier single-class constructor ``OperandQuant(fmt, scaling=..., ...)`` still builds
the right class (for one release) with the same ValueErrors as before.
"""

import dataclasses
import pickle

import pytest

from lowprec.numerics import operand_quant as oq
from lowprec.numerics import recipes
from lowprec.numerics.rounding import Nearest, Stochastic

# Every option of the earlier single class with its default, in its order.
_OLD_DEFAULTS = dict(fmt=None, scaling="block", block_shape=None, scale_rule="floor",
                     rounding=Nearest(), prescale=1.0, clip="none",
                     macro_block=None, amax_history_len=1024, amax_compute_algo="max",
                     margin=0, convention="te", amax_axis_name=None)


def _builtin_operands():
  return [(f"{name}/{g}/{side}", op) for name in recipes.names()
          for g, gemm in zip(recipes.GEMM_NAMES, recipes.get(name).gemms)
          for side, op in (("lhs", gemm.lhs), ("rhs", gemm.rhs)) if op is not None]


@pytest.mark.parametrize("old,kind,typed", [
    (dict(fmt="e4m3", scale_rule="rceil"), oq.MXQuant, oq.MXQuant("e4m3", scale_rule="rceil")),
    (dict(fmt="e2m1", block_shape=(32, 32), clip="rms"), oq.MXQuant,
     oq.MXQuant("e2m1", block_shape=(32, 32), clip="rms")),
    (dict(fmt="nvfp4", rounding=Stochastic()), oq.NVFP4Quant,
     oq.NVFP4Quant(rounding=Stochastic())),
    (dict(fmt="nvfp4", block_shape=16, convention="torchao"), oq.NVFP4Quant,
     oq.NVFP4Quant(convention="torchao")),
    (dict(fmt="e5m2", scaling="tensor", amax_axis_name="data"), oq.TensorQuant,
     oq.TensorQuant("e5m2", amax_axis_name="data")),
    (dict(fmt="e4m3", scaling="delayed", amax_history_len=16, margin=1), oq.DelayedQuant,
     oq.DelayedQuant("e4m3", amax_history_len=16, margin=1)),
])
def test_the_old_constructor_builds_the_class_of_its_mode(old, kind, typed):
  op = recipes.OperandQuant(**old)
  assert type(op) is kind and isinstance(op, recipes.OperandQuant)
  assert op == typed and hash(op) == hash(typed)
  # Every option reads as the old class read it: given, or its default.
  want = {**_OLD_DEFAULTS, **old}
  if kind in (oq.MXQuant, oq.NVFP4Quant):  # blocks default to 32 (MX) and 16 (NVFP4)
    want["block_shape"] = old.get("block_shape") or (32 if kind is oq.MXQuant else 16)
  assert op.options() == want
  assert recipes.OperandQuant(**op.options()) == op


def test_positional_arguments_keep_the_old_order():
  assert recipes.OperandQuant("e4m3", "tensor") == oq.TensorQuant("e4m3")
  assert recipes.OperandQuant("e2m1", "block", 16, "ceil") == oq.MXQuant(
      "e2m1", block_shape=16, scale_rule="ceil")
  with pytest.raises(TypeError, match="multiple values for argument 'fmt'"):
    recipes.OperandQuant("e4m3", fmt="e5m2")
  with pytest.raises(TypeError, match="unexpected keyword argument 'blocks'"):
    recipes.OperandQuant("e4m3", blocks=32)
  with pytest.raises(TypeError, match="missing required argument: 'fmt'"):
    recipes.OperandQuant(scaling="tensor")


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


@pytest.mark.parametrize("old,message", [
    (dict(fmt="nvfp4", scale_rule="ceil"), r"nvfp4 has no MX scale rule"),
    (dict(fmt="e4m3", scaling="tensor", scale_rule="ceil"), r"scale_rule is an MX option"),
    (dict(fmt="e4m3", scaling="delayed", block_shape=32), r"block_shape describes blocks"),
    (dict(fmt="e4m3", convention="torchao"), r"convention is an nvfp4 option"),
    (dict(fmt="e4m3", amax_axis_name="d"), r"amax_axis_name reduces a tensor amax"),
    (dict(fmt="nvfp4", macro_block=64), r"clip and macro_block apply to MX block"),
    (dict(fmt="e4m3", scaling="tensor", margin=2), r"delayed-scaling options"),
    (dict(fmt="e4m3", scaling="row"), r"scaling must be 'block', 'tensor' or 'delayed'"),
])
def test_the_old_constructor_names_an_option_its_mode_does_not_take(old, message):
  with pytest.raises(ValueError, match=message):
    recipes.OperandQuant(**old)


def test_replace_keeps_the_class_or_moves_to_the_new_mode():
  op = oq.MXQuant("e4m3", scale_rule="rceil")
  assert oq.replace(op, clip="rms") == oq.MXQuant("e4m3", scale_rule="rceil", clip="rms")
  assert oq.replace(oq.TensorQuant("e4m3"), scaling="delayed") == oq.DelayedQuant("e4m3")
  with pytest.raises(ValueError, match="clip and macro_block apply to MX block"):
    oq.replace(oq.NVFP4Quant(), clip="rms")
  with pytest.raises(ValueError, match="scale_rule is an MX option"):
    oq.replace(op, scaling="tensor", block_shape=None)
  with pytest.raises(TypeError, match="op must be an OperandQuant"):
    oq.replace({"fmt": "e4m3"}, clip="rms")


def test_builtin_recipes_hold_the_typed_classes_and_round_trip():
  kinds = {name: type(op) for name, op in _builtin_operands()}
  assert kinds["mxfp8/forward/lhs"] is oq.MXQuant
  assert kinds["mxfp4/wgrad/rhs"] is oq.MXQuant
  assert kinds["nvfp4/dgrad/lhs"] is oq.NVFP4Quant
  assert kinds["fp8/forward/rhs"] is oq.TensorQuant
  assert kinds["fp8_delayed/wgrad/rhs"] is oq.DelayedQuant
  for name, op in _builtin_operands():
    assert recipes.OperandQuant(**op.options()) == op, name
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

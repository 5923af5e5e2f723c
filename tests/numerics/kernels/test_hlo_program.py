"""The GEMMs and custom calls read from hand-written optimized HLO text.

The real compiles (an f8 x f8 dot_general for H200 holds an f8 GEMM, a bf16 one does
not) are in tests/numerics/kernels/test_step_compile.py (they need the toolchain).
"""

import textwrap

import pytest

from lowprec.numerics.kernels import hlo_program

# Shaped after the H200 program of an f8 x f8 -> f32 dot_general (jax 0.10.2): the
# gemm fusion's dot takes the f8 operands (one through a transpose in the fusion).
_NATIVE = textwrap.dedent("""\
    HloModule jit_f, entry_computation_layout={(f8e4m3fn[64,128]{1,0}, f8e4m3fn[128,256]{1,0})->f32[64,256]{1,0}}

    %gemm_fusion_dot_computation (parameter_0: f8e4m3fn[64,128], parameter_1: f8e4m3fn[256,128]) -> f32[64,256] {
      %parameter_0 = f8e4m3fn[64,128]{1,0} parameter(0)
      %parameter_1 = f8e4m3fn[256,128]{1,0} parameter(1)
      %transpose.1 = f8e4m3fn[128,256]{0,1} transpose(%parameter_1), dimensions={1,0}
      ROOT %dot.1 = f32[64,256]{1,0} dot(%parameter_0, %transpose.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/dot_general"}
    }

    ENTRY %main.4 (x.1: f8e4m3fn[64,128], y.1: f8e4m3fn[256,128]) -> f32[64,256] {
      %x.1 = f8e4m3fn[64,128]{1,0} parameter(0)
      %y.1 = f8e4m3fn[256,128]{1,0} parameter(1)
      ROOT %gemm_fusion_dot.1 = f32[64,256]{1,0} fusion(%x.1, %y.1), kind=kCustom, calls=%gemm_fusion_dot_computation, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
    }
    """)

# An emulated GEMM: f8 storage enters the fusion, but it is dequantized to bf16 inside
# it, so the dot runs on bf16.
_EMULATED = textwrap.dedent("""\
    %fused_dequant_dot (p0: f8e4m3fn[8,16], p1: bf16[16,4]) -> f32[8,4] {
      %p0 = f8e4m3fn[8,16]{1,0} parameter(0)
      %convert.3 = bf16[8,16]{1,0} convert(%p0)
      %p1 = bf16[16,4]{1,0} parameter(1)
      ROOT %dot.7 = f32[8,4]{1,0} dot(bf16[8,16]{1,0} %convert.3, bf16[16,4]{1,0} %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    }

    ENTRY %main (a: f8e4m3fn[8,16], b: bf16[16,4], c: f32[4,4]) -> f32[8,4] {
      %a = f8e4m3fn[8,16]{1,0} parameter(0)
      %b = bf16[16,4]{1,0} parameter(1)
      %c = f32[4,4]{1,0} parameter(2)
      %solve = f32[4,4]{1,0} custom-call(%c, %c), custom_call_target="__cublas$triangularSolve"
      %kernel = (f32[8,16]{1,0}, s32[8]{0}) custom-call(f32[8,16]{1,0} %a, s32[] %b), custom_call_target="__gpu$xla.gpu.triton", backend_config={"name":"mx_quantize"}
      ROOT %fusion.2 = f32[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dequant_dot
    }
    """)

# A cuBLASLt FP8 GEMM (tuple result: the output and its workspace) and a bf16 cuBLAS one.
_CUBLAS = textwrap.dedent("""\
    ENTRY %main (a: f8e4m3fn[32,64], b: f8e5m2[64,16], s: f32[], d: bf16[4,8], e: bf16[8,2]) -> f32[32,16] {
      %a = f8e4m3fn[32,64]{1,0} parameter(0)
      %b = f8e5m2[64,16]{1,0} parameter(1)
      %s = f32[] parameter(2)
      %d = bf16[4,8]{1,0} parameter(3)
      %e = bf16[8,2]{1,0} parameter(4)
      %cublas-lt-matmul.1 = (f32[32,16]{1,0}, s8[4194304]{0}) custom-call(%a, %b, %s, %s), custom_call_target="__cublas$lt$matmul$f8", backend_config={"operation_queue_id":"0","gemm_backend_config":{"alpha_real":1,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"epilogue":"DEFAULT"}}
      %gemm = (bf16[4,2]{1,0}, s8[1024]{0}) custom-call(%d, %e), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
      ROOT %get-tuple-element.1 = f32[32,16]{1,0} get-tuple-element(%cublas-lt-matmul.1), index=0
    }
    """)

# TPU: the dot became a convolution.
_TPU = textwrap.dedent("""\
    ENTRY %main.2 (p0: bf16[128,256], p1: bf16[256,512]) -> f32[128,512] {
      %p0 = bf16[128,256]{1,0:T(8,128)(2,1)} parameter(0)
      %p1 = bf16[256,512]{1,0:T(8,128)(2,1)} parameter(1)
      ROOT %convolution.1 = f32[128,512]{1,0:T(8,128)} convolution(%p0, %p1), dim_labels=bf_io->bf
    }
    """)


def test_a_gemm_fusion_on_f8_operands_is_narrow():
  (g,) = hlo_program.gemms(_NATIVE)
  assert (g.op, g.operand_types, g.out_type) == ("dot", ("f8e4m3fn", "f8e4m3fn"), "f32")
  assert g.computation == "gemm_fusion_dot_computation"
  assert g.narrow and g.flops == 2 * 64 * 256 * 128
  assert hlo_program.narrow_gemms(_NATIVE) == [g]
  assert hlo_program.summary(_NATIVE) == {"f8e4m3fn x f8e4m3fn -> f32 dot": 1}


def test_f8_storage_dequantized_inside_the_fusion_is_not_a_narrow_gemm():
  (g,) = hlo_program.gemms(_EMULATED)
  assert g.operand_types == ("bf16", "bf16") and not g.narrow  # inline operand shapes
  assert g.flops == 2 * 8 * 4 * 16
  assert hlo_program.narrow_gemms(_EMULATED) == []


def test_cublas_gemms_are_gemms_and_a_triangular_solve_is_not():
  f8, bf16 = hlo_program.gemms(_CUBLAS)
  assert (f8.op, f8.target) == ("custom-call", "__cublas$lt$matmul$f8")
  assert f8.operand_types == ("f8e4m3fn", "f8e5m2", "f32", "f32") and f8.narrow
  assert f8.out_type == "f32" and f8.flops == 2 * 32 * 16 * 64
  assert (bf16.target, bf16.narrow, bf16.flops) == ("__cublas$gemm", False, 2 * 4 * 2 * 8)
  assert [g.target for g in hlo_program.gemms(_EMULATED)] == [None]  # no triangularSolve


def test_a_tpu_convolution_is_a_gemm():
  (g,) = hlo_program.gemms(_TPU)
  assert (g.op, g.operand_types, g.out_type, g.narrow) == (
      "convolution", ("bf16", "bf16"), "f32", False)
  assert g.flops is None  # the text holds no contraction dims for it


def test_custom_calls_count_operand_and_result_bytes():
  solve, kernel = hlo_program.custom_calls(_EMULATED)
  assert (solve.target, solve.operand_bytes, solve.result_bytes) == (
      "__cublas$triangularSolve", 2 * 16 * 4, 16 * 4)
  assert kernel.target == "__gpu$xla.gpu.triton"
  assert kernel.operand_bytes == 8 * 16 * 4 + 4  # inline shapes: f32[8,16], s32[]
  assert kernel.result_bytes == 8 * 16 * 4 + 8 * 4  # both tuple elements


@pytest.mark.parametrize("dtype,dims,nbytes", [("f8e4m3fn", (3, 5), 15), ("bf16", (4,), 8),
                                                ("f4e2m1fn", (8, 2), 8), ("pred", (), 1),
                                                ("f8e8m0fnu", (2, 2), 4)])
def test_array_bytes(dtype, dims, nbytes):
  assert hlo_program.Array(dtype, dims).nbytes == nbytes

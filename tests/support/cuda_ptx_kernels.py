"""Hand-written NVPTX LLVM IR kernels shared by tests/codegen and tests/gpu."""

from kiln.codegen.cuda import NVPTX_TRIPLE

# out[i] = max(a[i], 0) over a 1-D grid, bounds-checked: the shape of a fused elementwise kernel.
RELU_KERNEL = f"""
target triple = "{NVPTX_TRIPLE}"
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
define ptx_kernel void @relu(ptr addrspace(1) %a, ptr addrspace(1) %out, i32 %n) {{
entry:
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %b = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %w = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %bw = mul i32 %b, %w
  %i = add i32 %bw, %t
  %in = icmp slt i32 %i, %n
  br i1 %in, label %body, label %done
body:
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %x = load float, ptr addrspace(1) %pa
  %y = call float @llvm.maxnum.f32(float %x, float 0.0)
  %po = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %y, ptr addrspace(1) %po
  br label %done
done:
  ret void
}}
declare float @llvm.maxnum.f32(float, float)
"""

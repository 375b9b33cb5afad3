// run.mjs -- run a kiln WebAssembly module's `main` under Node (no WASI, no C library).
//
//   node run.mjs model.wasm kiln_ input.bin output.bin OUTPUT_FLOATS
//
// The module (kiln.export.wasm.export_wasm) imports malloc/calloc/free and the
// parallel-loop runner from `env`: this file gives a bump allocator over the
// module's memory and runs parallel loops serially through the function table.
// `main`'s raw kernel takes a pointer per input and per output (float32 here).
import { readFileSync, writeFileSync } from "node:fs";

const [wasmPath, prefix, inPath, outPath, outFloats] = process.argv.slice(2);
let instance;
let top = 0;
const memory = () => instance.exports.memory;
function malloc(size) {
  const start = Math.ceil(top / 64) * 64;
  const end = start + Math.max(size, 1);
  const have = memory().buffer.byteLength;
  if (end > have) memory().grow(Math.ceil((end - have) / 65536));
  top = end;
  return start;
}
const env = {
  malloc,
  calloc: (n, size) => {
    const p = malloc(n * size);
    new Uint8Array(memory().buffer, p, n * size).fill(0);
    return p;
  },
  free: () => {},
  [`${prefix}_parallel_for`]: (n, body, context) =>
    n > 0n ? instance.exports.__indirect_function_table.get(body)(0n, n, context) : 0,
};
({ instance } = await WebAssembly.instantiate(readFileSync(wasmPath), { env }));
top = instance.exports.__heap_base.value;
const input = readFileSync(inPath);
const x = malloc(input.length);
new Uint8Array(memory().buffer, x, input.length).set(input);
const n = Number(outFloats);
const y = malloc(4 * n);
const status = instance.exports[`${prefix}_kernel_main`](x, y);
if (status !== 0) {
  console.error(`main failed with status ${status}`);
  process.exit(1);
}
writeFileSync(outPath, Buffer.from(new Uint8Array(memory().buffer, y, 4 * n)));

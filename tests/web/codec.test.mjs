// The web client's codec (io/daemon/src/web/assets/codec.js) against the kernel's
// wire vectors (kernel/tests/vectors/cbor.json, which kernel/tests/vectors.rs
// checks against the kernel's own codec), plus round-trip properties.
//
// Run: node --test tests/web/

import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";

import {
  CborError,
  DEFAULT_LIMITS,
  DEFAULT_MAX_FRAME_LEN,
  FrameError,
  decode,
  decodeFrame,
  encode,
  encodeFrame,
} from "../../io/daemon/src/web/assets/codec.js";

const VECTORS_URL = new URL("../../kernel/tests/vectors/cbor.json", import.meta.url);
const doc = JSON.parse(fs.readFileSync(VECTORS_URL, "utf8"));

/** @param {string} hex */
function unhex(hex) {
  assert.equal(hex.length % 2, 0, `odd hex length: ${hex}`);
  const bytes = new Uint8Array(hex.length / 2);
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return bytes;
}

/** @param {Uint8Array} bytes */
function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The JS number of a tagged float: a JSON number or a decimal string ("-0", "NaN", "Infinity"…). */
function float(x) {
  return typeof x === "number" ? x : Number(x);
}

/**
 * The JS value a tagged JSON value stands for, and whether JS can carry it
 * exactly (a map with a duplicate key cannot; one whose keys JS would list in
 * another order, such as "1" after "b", cannot be encoded in wire order).
 */
function jsValue(tagged) {
  const [[tag, inner], ...rest] = Object.entries(tagged);
  assert.equal(rest.length, 0, `not a tagged value: ${JSON.stringify(tagged)}`);
  switch (tag) {
    case "null":
      return { value: null, exact: true };
    case "bool":
    case "int":
    case "text":
      return { value: inner, exact: true };
    case "float":
      return { value: float(inner), exact: true };
    case "bytes":
      return { value: unhex(inner), exact: true };
    case "array": {
      const items = inner.map(jsValue);
      return { value: items.map((i) => i.value), exact: items.every((i) => i.exact) };
    }
    case "map": {
      const object = {};
      let exact = true;
      for (const [key, item] of inner) {
        const converted = jsValue(item);
        exact &&= converted.exact && !Object.prototype.hasOwnProperty.call(object, key);
        // defineProperty, so that "__proto__" is an own key, not the prototype.
        Object.defineProperty(object, key, { value: converted.value, enumerable: true, writable: true, configurable: true });
      }
      const order = JSON.stringify(Object.keys(object));
      exact &&= order === JSON.stringify(inner.map(([key]) => key));
      return { value: object, exact };
    }
    case "nest": {
      const converted = jsValue(inner.value);
      let value = converted.value;
      for (let i = 0; i < inner.levels; i++) value = [value];
      return { value, exact: converted.exact };
    }
    default:
      throw new Error(`unknown tag ${tag}`);
  }
}

/** Strict deep equality: −0 is not 0, maps compare key lists in order. */
function same(actual, expected, path = "$") {
  if (typeof expected === "number") {
    assert.ok(Object.is(actual, expected), `${path}: ${actual} is not ${Object.is(expected, -0) ? "-0" : expected}`);
  } else if (expected === null || typeof expected !== "object") {
    assert.equal(actual, expected, path);
  } else if (expected instanceof Uint8Array) {
    assert.ok(actual instanceof Uint8Array, `${path}: not a Uint8Array`);
    assert.equal(hex(actual), hex(expected), path);
  } else if (Array.isArray(expected)) {
    assert.ok(Array.isArray(actual), `${path}: not an array`);
    assert.equal(actual.length, expected.length, `${path}: length`);
    expected.forEach((item, i) => same(actual[i], item, `${path}[${i}]`));
  } else {
    assert.ok(actual !== null && typeof actual === "object" && !Array.isArray(actual), `${path}: not a map`);
    assert.deepEqual(Object.keys(actual), Object.keys(expected), `${path}: keys`);
    for (const key of Object.keys(expected)) same(actual[key], expected[key], `${path}.${key}`);
  }
}

/** JS limits from the vectors' snake_case ones. */
function limitsOf(vector) {
  const own = vector.limits ?? {};
  const limits = {};
  if (own.max_depth !== undefined) limits.maxDepth = own.max_depth;
  if (own.max_container_len !== undefined) limits.maxContainerLen = own.max_container_len;
  if (own.max_byte_len !== undefined) limits.maxByteLen = own.max_byte_len;
  if (own.max_frame_len !== undefined) limits.maxFrameLen = own.max_frame_len;
  return limits;
}

/** Runs `fn`, expecting it to throw an error of `type`; returns the error. */
function thrown(fn, type, what) {
  try {
    const value = fn();
    assert.fail(`${what}: expected ${type.name}, got ${JSON.stringify(value, (_, v) => (v instanceof Uint8Array ? hex(v) : v))}`);
  } catch (error) {
    if (error instanceof assert.AssertionError) throw error;
    assert.ok(error instanceof type, `${what}: threw ${error} instead of a ${type.name}`);
    return error;
  }
}

test("the vectors assume the codec's default limits", () => {
  assert.deepEqual(doc.limits, {
    max_depth: DEFAULT_LIMITS.maxDepth,
    max_container_len: DEFAULT_LIMITS.maxContainerLen,
    max_byte_len: DEFAULT_LIMITS.maxByteLen,
    max_frame_len: DEFAULT_MAX_FRAME_LEN,
  });
});

test("encode vectors: byte-exact, and they decode back", () => {
  let encoded = 0;
  for (const v of doc.encode) {
    const { value, exact } = jsValue(v.value);
    if (exact) {
      assert.equal(hex(encode(value)), v.hex, v.name);
      encoded++;
    }
    same(decode(unhex(v.hex)), jsValue(v.decoded ?? v.value).value, v.name);
  }
  assert.ok(encoded >= doc.encode.length - 2, `only ${encoded} of ${doc.encode.length} encode vectors are representable`);
});

test("decode vectors decode to their value", () => {
  assert.ok(doc.decode.length > 0);
  for (const v of doc.decode) {
    same(decode(unhex(v.hex), limitsOf(v)), jsValue(v.value).value, v.name);
  }
});

test("reject vectors fail with the kernel's kind and message", () => {
  assert.ok(doc.reject.length > 0);
  for (const v of doc.reject) {
    const error = thrown(() => decode(unhex(v.hex), limitsOf(v)), CborError, v.name);
    assert.equal(error.kind, v.kind, `${v.name}: ${error.message}`);
    assert.equal(error.message, v.message, v.name);
  }
});

test("encode_reject vectors fail with the kernel's kind", () => {
  let checked = 0;
  for (const v of doc.encode_reject) {
    const { value, exact } = jsValue(v.value);
    if (!exact) continue; // A duplicate key: a JS object cannot hold one.
    const error = thrown(() => encode(value), CborError, v.name);
    assert.equal(error.kind, v.kind, `${v.name}: ${error.message}`);
    // JS cannot tell the integer 2^53 from the float: the kernel words them
    // differently after ", got".
    if ("float" in v.value) assert.equal(error.message, v.message, v.name);
    else assert.equal(error.message.split(", got")[0], v.message.split(", got")[0], v.name);
    checked++;
  }
  assert.ok(checked >= doc.encode_reject.length - 1);
});

test("frame vectors: byte-exact whole frames", () => {
  assert.ok(doc.frames.length > 0);
  for (const v of doc.frames) {
    const { value } = jsValue(v.value);
    const options = limitsOf(v);
    assert.equal(hex(encodeFrame(value, options)), v.hex, v.name);
    same(decodeFrame(unhex(v.hex), options), value, v.name);
    // As a WebSocket delivers it: an ArrayBuffer.
    same(decodeFrame(unhex(v.hex).buffer, options), value, `${v.name} (ArrayBuffer)`);
  }
});

test("frame_reject vectors fail in their layer", () => {
  assert.ok(doc.frame_reject.length > 0);
  for (const v of doc.frame_reject) {
    const type = v.layer === "frame" ? FrameError : CborError;
    const error = thrown(() => decodeFrame(unhex(v.hex), limitsOf(v)), type, v.name);
    assert.equal(error.kind, v.kind, `${v.name}: ${error.message}`);
    if (v.message !== undefined) assert.equal(error.message, v.message, v.name);
  }
});

// ---------------------------------------------------------------------------
// JS-specific mapping
// ---------------------------------------------------------------------------

test("undefined properties are omitted; other undefined values do not encode", () => {
  assert.equal(hex(encode({ a: 1, b: undefined, c: null })), "a26161016163f6");
  assert.equal(hex(encode({ type: "hello", version: 1, token: undefined })), "a264747970656568656c6c6f6776657273696f6e01");
  for (const bad of [undefined, [1, undefined], () => 1, Symbol("s"), 10n]) {
    assert.equal(thrown(() => encode(bad), CborError, String(typeof bad)).kind, "other");
  }
  for (const bad of [new Date(0), new Map(), new Set(), new (class Point {})(), /x/]) {
    assert.equal(thrown(() => encode(bad), CborError, bad.constructor.name).kind, "other");
  }
});

test("numbers: integers shortest, non-integers and -0 as float64, unsafe ones rejected", () => {
  assert.equal(hex(encode(-0)), "fb8000000000000000");
  assert.ok(Object.is(decode(unhex("fb8000000000000000")), -0));
  assert.equal(hex(encode(0)), "00");
  assert.equal(hex(encode(2.0)), "02");
  assert.equal(hex(encode(1.5)), "fb3ff8000000000000");
  assert.equal(hex(encode(Number.MAX_SAFE_INTEGER)), "1b001fffffffffffff");
  assert.equal(hex(encode(-Number.MAX_SAFE_INTEGER)), "3b001ffffffffffffe");
  for (const n of [2 ** 53, -(2 ** 53), 1e20, Number.MAX_VALUE]) {
    assert.equal(thrown(() => encode(n), CborError, String(n)).kind, "integer_out_of_range");
  }
  for (const n of [NaN, Infinity, -Infinity]) {
    assert.equal(thrown(() => encode(n), CborError, String(n)).kind, "non_finite_number");
  }
});

test("strings: lone surrogates do not encode; a byte-order mark is kept", () => {
  for (const s of ["\ud800", "a\udc00b", "\udbff"]) {
    assert.equal(thrown(() => encode(s), CborError, JSON.stringify(s)).kind, "invalid_utf8");
  }
  assert.equal(hex(encode("\ud83d\ude00")), "64f09f9880");
  assert.equal(decode(unhex("63efbbbf")), "\ufeff");
});

test("decoded maps have no prototype, and __proto__ is a plain key", () => {
  const map = decode(encode(JSON.parse('{"__proto__": {"polluted": true}, "constructor": 1}')));
  assert.equal(Object.getPrototypeOf(map), null);
  assert.deepEqual(Object.keys(map), ["__proto__", "constructor"]);
  assert.equal(map.constructor, 1);
  assert.equal(({}).polluted, undefined);
  assert.equal(Object.prototype.polluted, undefined);
  // Null-prototype objects encode like plain ones.
  assert.equal(hex(encode(map)), hex(encode(JSON.parse('{"__proto__": {"polluted": true}, "constructor": 1}'))));
});

test("inputs: Uint8Array, Buffer, ArrayBuffer, DataView and subarrays", () => {
  const bytes = unhex("ff8301020300");
  const inner = bytes.subarray(1, 5);
  assert.deepEqual(decode(inner), [1, 2, 3]);
  assert.deepEqual(decode(Buffer.from(inner)), [1, 2, 3]);
  assert.deepEqual(decode(inner.slice().buffer), [1, 2, 3]);
  assert.deepEqual(decode(new DataView(bytes.buffer, 1, 4)), [1, 2, 3]);
  assert.ok(decode(unhex("43010203")) instanceof Uint8Array);
  assert.throws(() => decode("83010203"), TypeError);
});

test("limits: explicit ones apply to decoding and encoding", () => {
  assert.equal(thrown(() => decode(unhex("8401020304"), { maxContainerLen: 3 }), CborError, "").kind, "container_limit");
  assert.equal(thrown(() => encode([1, 2, 3, 4], { maxContainerLen: 3 }), CborError, "").kind, "container_limit");
  assert.equal(thrown(() => encode("1234567", { maxByteLen: 6 }), CborError, "").kind, "byte_length_limit");
  assert.equal(thrown(() => encode([[[]]], { maxDepth: 1 }), CborError, "").kind, "depth_limit");
  // A configured depth above 512 acts as 512.
  const deep = new Uint8Array(1000).fill(0x81);
  deep[999] = 0x80;
  const error = thrown(() => decode(deep, { maxDepth: 100_000 }), CborError, "deep");
  assert.equal(error.message, "CBOR nesting depth exceeds configured limit of 512");
  // A cycle is caught by the depth limit.
  const cycle = { a: [] };
  cycle.a.push(cycle);
  assert.equal(thrown(() => encode(cycle), CborError, "cycle").kind, "depth_limit");
});

test("frames: the payload limit applies both ways", () => {
  assert.equal(hex(encodeFrame([1, 2, 3], { maxFrameLen: 4 })), "0000000483010203");
  const error = thrown(() => encodeFrame([1, 2, 3], { maxFrameLen: 3 }), FrameError, "encode");
  assert.equal(error.kind, "too_long");
  assert.equal(error.message, "Frame payload length 4 exceeds configured limit of 3");
  assert.equal(thrown(() => decodeFrame(unhex("0000000483010203"), { maxFrameLen: 3 }), FrameError, "decode").kind, "too_long");
});

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

/** A small seeded PRNG (mulberry32), so failures reproduce. */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function arbitrary(random) {
  const int = (n) => Math.floor(random() * n);
  const pick = (list) => list[int(list.length)];
  const scalarNumber = () => {
    switch (int(6)) {
      case 0:
        return int(2001) - 1000;
      case 1:
        return pick([0, -0, 23, 24, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, Number.MAX_SAFE_INTEGER, -Number.MAX_SAFE_INTEGER]);
      case 2:
        return Math.floor((random() * 2 - 1) * Number.MAX_SAFE_INTEGER);
      case 3: {
        // Any finite float64, from random bits.
        const view = new DataView(new ArrayBuffer(8));
        do {
          view.setUint32(0, int(2 ** 32));
          view.setUint32(4, int(2 ** 32));
        } while (!Number.isFinite(view.getFloat64(0)) || (Number.isInteger(view.getFloat64(0)) && !Number.isSafeInteger(view.getFloat64(0))));
        return view.getFloat64(0);
      }
      case 4:
        return (random() - 0.5) * 1e6;
      default:
        return random();
    }
  };
  const alphabet = ["a", "b", "z", "0", "1", " ", "é", "✓", "😀", "\u0000", "\n", '"', "__proto__", "ключ", "\ufeff"];
  const string = () => Array.from({ length: int(8) }, () => pick(alphabet)).join("");
  const value = (depth) => {
    const kind = depth >= 5 ? int(5) : int(7);
    switch (kind) {
      case 0:
        return pick([null, true, false]);
      case 1:
      case 2:
        return scalarNumber();
      case 3:
        return string();
      case 4:
        return Uint8Array.from({ length: int(12) }, () => int(256));
      case 5:
        return Array.from({ length: int(6) }, () => value(depth + 1));
      default: {
        const object = {};
        for (let i = int(6); i > 0; i--) {
          Object.defineProperty(object, string(), { value: value(depth + 1), enumerable: true, writable: true, configurable: true });
        }
        return object;
      }
    }
  };
  return () => value(0);
}

test("property: values round-trip, and re-encode to the same bytes", () => {
  const random = rng(0x5eed);
  const next = arbitrary(random);
  for (let i = 0; i < 2000; i++) {
    const value = next();
    const bytes = encode(value);
    const back = decode(bytes);
    same(back, value, `case ${i}`);
    assert.equal(hex(encode(back)), hex(bytes), `case ${i}`);
    const framed = encodeFrame(value);
    same(decodeFrame(framed), value, `case ${i} framed`);
  }
});

test("property: arbitrary and mutated bytes only ever throw CborError", () => {
  const random = rng(0xbad);
  const next = arbitrary(random);
  const check = (bytes) => {
    try {
      const value = decode(bytes);
      // Whatever decodes re-encodes, and decodes again to the same value.
      same(decode(encode(value)), value);
    } catch (error) {
      if (error instanceof assert.AssertionError) throw error;
      assert.ok(error instanceof CborError, `${hex(bytes)}: ${error}`);
      assert.equal(typeof error.kind, "string");
    }
  };
  for (let i = 0; i < 3000; i++) {
    check(Uint8Array.from({ length: Math.floor(random() * 40) }, () => Math.floor(random() * 256)));
    const bytes = encode(next());
    for (let edits = 1 + Math.floor(random() * 3); edits > 0; edits--) {
      bytes[Math.floor(random() * bytes.length)] = Math.floor(random() * 256);
    }
    check(bytes);
    check(bytes.subarray(0, Math.floor(random() * (bytes.length + 1))));
  }
});

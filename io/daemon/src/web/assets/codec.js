// @ts-check
/**
 * The pi protocol v1 wire codec for the browser: the strict CBOR subset and
 * whole frames (a 4-byte big-endian payload length, then the payload).
 *
 * Byte-exact with the kernel's codec (`kernel/src/wire/`); both are checked
 * against `kernel/tests/vectors/cbor.json`. Error kinds and messages are the
 * kernel's.
 *
 * JS mapping:
 * - CBOR integer ↔ a number that is a safe integer (±(2^53 − 1));
 * - float64 ↔ any other finite number, and −0 (which stays a float64, as in
 *   the kernel); an integral float64 decodes as an integer;
 * - text ↔ string, bytes ↔ Uint8Array, array ↔ Array, null/true/false;
 * - map ↔ plain object, keys in insertion order. Decoded maps have no
 *   prototype (`Object.create(null)`), so a `__proto__` key is a plain own
 *   property. Properties whose value is `undefined` are omitted when
 *   encoding. Note that JS objects list integer-like keys ("1") first,
 *   whatever the wire order.
 *
 * @module codec
 */

/** JavaScript's `Number.MAX_SAFE_INTEGER`, the largest integer magnitude carried. */
export const MAX_SAFE_INTEGER = Number.MAX_SAFE_INTEGER;

/** Default maximum frame payload length: 16 MiB (the kernel's `DEFAULT_MAX_FRAME_LEN`). */
export const DEFAULT_MAX_FRAME_LEN = 16 * 1024 * 1024;

/** Bytes of the frame length prefix. */
export const FRAME_HEADER_LEN = 4;

/** The largest nesting depth honoured, whatever `maxDepth` says. */
export const MAX_CONFIGURABLE_DEPTH = 512;

/**
 * Limits enforced on untrusted input (and on what is encoded, so that
 * whatever encodes also decodes).
 *
 * @typedef {object} CborLimits
 * @property {number} [maxDepth] Maximum nesting depth; the top-level item is
 *   at depth 0 (default 64, at most 512).
 * @property {number} [maxContainerLen] Maximum elements of an array or
 *   entries of a map (default 1,000,000).
 * @property {number} [maxByteLen] Maximum byte length of a string, and of
 *   the whole item (default 16 MiB).
 */

/** @type {Readonly<Required<CborLimits>>} */
export const DEFAULT_LIMITS = Object.freeze({
  maxDepth: 64,
  maxContainerLen: 1_000_000,
  maxByteLen: 16 * 1024 * 1024,
});

/**
 * Why an item could not be encoded or decoded. `kind` is the kernel's
 * `CborErrorKind` in snake_case: `truncated`, `trailing_data`, `tag`,
 * `indefinite_length`, `break`, `unsupported_simple`,
 * `malformed_additional_info`, `non_finite_number`, `integer_out_of_range`,
 * `argument_out_of_range`, `non_text_key`, `duplicate_key`, `invalid_utf8`,
 * `depth_limit`, `container_limit`, `byte_length_limit`, or `other` (a JS
 * value with no CBOR form: undefined, a function, a symbol, a bigint, a
 * class instance).
 */
export class CborError extends Error {
  /**
   * @param {string} kind
   * @param {string} message
   */
  constructor(kind, message) {
    super(message);
    this.name = "CborError";
    /** @type {string} */
    this.kind = kind;
  }
}

/**
 * Why a WebSocket message is not one whole frame. `kind` is `too_long` (the
 * declared or actual payload length is over the limit), `truncated` (the
 * message ends inside the header or the payload) or `trailing_data` (bytes
 * follow the frame).
 */
export class FrameError extends Error {
  /**
   * @param {string} kind
   * @param {string} message
   */
  constructor(kind, message) {
    super(message);
    this.name = "FrameError";
    /** @type {string} */
    this.kind = kind;
  }
}

const TWO_32 = 2 ** 32;

/**
 * @param {CborLimits | undefined} limits
 * @returns {Required<CborLimits>}
 */
function resolveLimits(limits) {
  if (!limits) return DEFAULT_LIMITS;
  return {
    maxDepth: limits.maxDepth ?? DEFAULT_LIMITS.maxDepth,
    maxContainerLen: limits.maxContainerLen ?? DEFAULT_LIMITS.maxContainerLen,
    maxByteLen: limits.maxByteLen ?? DEFAULT_LIMITS.maxByteLen,
  };
}

/** @param {number} max */
function depthError(max) {
  return new CborError("depth_limit", `CBOR nesting depth exceeds configured limit of ${max}`);
}

/**
 * A number as Rust's `{}` prints an f64 (for NaN and the infinities).
 * @param {number} f
 */
function rustFloat(f) {
  if (Number.isNaN(f)) return "NaN";
  if (f === Infinity) return "inf";
  if (f === -Infinity) return "-inf";
  return String(f);
}

/**
 * A number as Rust's `{:e}` prints an f64: shortest digits, `e` without `+`.
 * @param {number} f
 */
function rustExp(f) {
  return f.toExponential().replace("e+", "e");
}

/**
 * A string as Rust's `{:?}` quotes it (for the common cases).
 * @param {string} s
 */
function rustDebug(s) {
  let out = '"';
  for (const ch of s) {
    const code = /** @type {number} */ (ch.codePointAt(0));
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (code === 0) out += "\\0";
    else if (code < 0x20 || code === 0x7f) out += `\\u{${code.toString(16)}}`;
    else out += ch;
  }
  return out + '"';
}

/**
 * A map key quoted for an error message, cut to 64 characters.
 * @param {string} key
 */
function quoteKey(key) {
  const chars = Array.from(key);
  return chars.length > 64 ? `${rustDebug(chars.slice(0, 64).join(""))}…` : rustDebug(key);
}

/** @param {string} key */
function duplicateKeyError(key) {
  return new CborError("duplicate_key", `CBOR map contains a duplicate key ${quoteKey(key)}`);
}

// ---------------------------------------------------------------------------
// Encoder
// ---------------------------------------------------------------------------

const textEncoder = new TextEncoder();

/** A growable output buffer. */
class Output {
  constructor() {
    this.bytes = new Uint8Array(256);
    this.view = new DataView(this.bytes.buffer);
    this.len = 0;
  }

  /** @param {number} extra */
  reserve(extra) {
    const needed = this.len + extra;
    if (needed <= this.bytes.length) return;
    let size = this.bytes.length * 2;
    while (size < needed) size *= 2;
    const bigger = new Uint8Array(size);
    bigger.set(this.bytes.subarray(0, this.len));
    this.bytes = bigger;
    this.view = new DataView(bigger.buffer);
  }

  /** @param {number} byte */
  push(byte) {
    this.reserve(1);
    this.bytes[this.len++] = byte;
  }

  /** @param {Uint8Array} bytes */
  append(bytes) {
    this.reserve(bytes.length);
    this.bytes.set(bytes, this.len);
    this.len += bytes.length;
  }

  /**
   * Writes an initial byte and its argument in the shortest form.
   * @param {number} major
   * @param {number} argument a safe integer ≥ 0
   */
  head(major, argument) {
    const prefix = major << 5;
    this.reserve(9);
    if (argument < 24) {
      this.bytes[this.len++] = prefix | argument;
    } else if (argument < 0x100) {
      this.bytes[this.len++] = prefix | 24;
      this.bytes[this.len++] = argument;
    } else if (argument < 0x10000) {
      this.bytes[this.len++] = prefix | 25;
      this.view.setUint16(this.len, argument);
      this.len += 2;
    } else if (argument < TWO_32) {
      this.bytes[this.len++] = prefix | 26;
      this.view.setUint32(this.len, argument);
      this.len += 4;
    } else {
      this.bytes[this.len++] = prefix | 27;
      this.view.setUint32(this.len, Math.floor(argument / TWO_32));
      this.view.setUint32(this.len + 4, argument % TWO_32);
      this.len += 8;
    }
  }

  /** @param {number} f */
  float64(f) {
    this.reserve(9);
    this.bytes[this.len++] = 0xfb;
    this.view.setFloat64(this.len, f);
    this.len += 8;
  }

  result() {
    return this.bytes.slice(0, this.len);
  }
}

/**
 * True for a string without lone surrogates (which UTF-8 cannot carry).
 * @param {string} s
 */
function isWellFormed(s) {
  // @ts-ignore: String.prototype.isWellFormed is ES2024.
  if (typeof s.isWellFormed === "function") return s.isWellFormed();
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

/**
 * @param {unknown} value
 * @returns {value is Record<string, unknown>}
 */
function isPlainObject(value) {
  if (typeof value !== "object" || value === null) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === null || proto === Object.prototype;
}

class Encoder {
  /** @param {Required<CborLimits>} limits */
  constructor(limits) {
    this.limits = limits;
    this.maxDepth = Math.min(limits.maxDepth, MAX_CONFIGURABLE_DEPTH);
    this.out = new Output();
  }

  /** @param {number} n */
  number(n) {
    if (!Number.isFinite(n)) {
      throw new CborError("non_finite_number", `CBOR numbers must be finite, got ${rustFloat(n)}`);
    }
    if (Number.isInteger(n) && !Object.is(n, -0)) {
      if (Math.abs(n) > MAX_SAFE_INTEGER) {
        throw new CborError(
          "integer_out_of_range",
          `CBOR integers must be safe JavaScript integers (within ±(2^53 − 1)), got ${rustExp(n)}`,
        );
      }
      if (n >= 0) this.out.head(0, n);
      else this.out.head(1, -1 - n);
      return;
    }
    this.out.float64(n);
  }

  /** @param {string} s */
  text(s) {
    if (!isWellFormed(s)) {
      throw new CborError("invalid_utf8", "CBOR text string contains a lone surrogate (not valid UTF-8)");
    }
    const bytes = textEncoder.encode(s);
    if (bytes.length > this.limits.maxByteLen) {
      throw new CborError(
        "byte_length_limit",
        `CBOR text string length exceeds configured limit of ${this.limits.maxByteLen}`,
      );
    }
    this.out.head(3, bytes.length);
    this.out.append(bytes);
  }

  /**
   * @param {string} kind
   * @param {number} len
   */
  containerLen(kind, len) {
    if (len > this.limits.maxContainerLen) {
      throw new CborError(
        "container_limit",
        `CBOR ${kind} length exceeds configured limit of ${this.limits.maxContainerLen}`,
      );
    }
  }

  /**
   * @param {unknown} value
   * @param {number} depth
   */
  value(value, depth) {
    if (depth > this.maxDepth) throw depthError(this.maxDepth);
    switch (typeof value) {
      case "boolean":
        this.out.push(value ? 0xf5 : 0xf4);
        return;
      case "number":
        this.number(value);
        return;
      case "string":
        this.text(value);
        return;
      case "object":
        break;
      default:
        throw new CborError("other", `Values of type ${typeof value} have no CBOR form`);
    }
    if (value === null) {
      this.out.push(0xf6);
    } else if (value instanceof Uint8Array) {
      if (value.length > this.limits.maxByteLen) {
        throw new CborError(
          "byte_length_limit",
          `CBOR byte string length exceeds configured limit of ${this.limits.maxByteLen}`,
        );
      }
      this.out.head(2, value.length);
      this.out.append(value);
    } else if (Array.isArray(value)) {
      this.containerLen("array", value.length);
      this.out.head(4, value.length);
      for (let i = 0; i < value.length; i++) this.value(value[i], depth + 1);
    } else if (isPlainObject(value)) {
      const keys = Object.keys(value).filter((key) => value[key] !== undefined);
      this.containerLen("map", keys.length);
      this.out.head(5, keys.length);
      for (const key of keys) {
        this.text(key);
        this.value(value[key], depth + 1);
      }
    } else {
      const what = value.constructor?.name ?? "object";
      throw new CborError("other", `A ${what} has no CBOR form (only plain objects encode as maps)`);
    }
  }
}

/**
 * Encodes one value as a CBOR item, shortest form, map keys in insertion
 * order, exactly as the kernel does.
 *
 * @param {unknown} value
 * @param {CborLimits} [limits] enforced as the kernel's encoder does
 *   (default {@link DEFAULT_LIMITS})
 * @returns {Uint8Array}
 * @throws {CborError}
 */
export function encode(value, limits) {
  const encoder = new Encoder(resolveLimits(limits));
  encoder.value(value, 0);
  const bytes = encoder.out.result();
  if (bytes.length > encoder.limits.maxByteLen) {
    throw new CborError(
      "byte_length_limit",
      `CBOR byte length exceeds configured limit of ${encoder.limits.maxByteLen}`,
    );
  }
  return bytes;
}

// ---------------------------------------------------------------------------
// Decoder
// ---------------------------------------------------------------------------

const utf8Decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * Where the first invalid UTF-8 sequence starts (Rust's `valid_up_to`), or
 * -1 when `bytes` is valid.
 * @param {Uint8Array} bytes
 */
function utf8ValidUpTo(bytes) {
  let i = 0;
  const n = bytes.length;
  while (i < n) {
    const b = bytes[i];
    if (b < 0x80) {
      i++;
      continue;
    }
    let need;
    let lo = 0x80;
    let hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b >= 0xe0 && b <= 0xef) {
      need = 2;
      if (b === 0xe0) lo = 0xa0;
      if (b === 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      need = 3;
      if (b === 0xf0) lo = 0x90;
      if (b === 0xf4) hi = 0x8f;
    } else return i;
    for (let k = 1; k <= need; k++) {
      if (i + k >= n) return i;
      const c = bytes[i + k];
      if (k === 1 ? c < lo || c > hi : c < 0x80 || c > 0xbf) return i;
    }
    i += need + 1;
  }
  return -1;
}

function truncated() {
  return new CborError("truncated", "Truncated CBOR payload");
}

/** @param {unknown} value */
function kindOf(value) {
  if (value === null) return "null";
  if (typeof value === "boolean") return "boolean";
  if (typeof value === "number") return Number.isInteger(value) && !Object.is(value, -0) ? "integer" : "number";
  if (typeof value === "string") return "string";
  if (value instanceof Uint8Array) return "byte string";
  if (Array.isArray(value)) return "array";
  return "map";
}

const SIMPLE_NAMES = /** @type {Record<number, string>} */ ({
  23: "undefined",
  24: "one-byte simple value",
  25: "float16",
  26: "float32",
  28: "reserved additional information",
  29: "reserved additional information",
  30: "reserved additional information",
});

class Decoder {
  /**
   * @param {Uint8Array} bytes
   * @param {Required<CborLimits>} limits
   */
  constructor(bytes, limits) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
    this.limits = limits;
    this.maxDepth = Math.min(limits.maxDepth, MAX_CONFIGURABLE_DEPTH);
  }

  byte() {
    if (this.pos >= this.bytes.length) throw truncated();
    return this.bytes[this.pos++];
  }

  /** @param {number} len */
  need(len) {
    if (len > this.bytes.length - this.pos) throw truncated();
  }

  /**
   * Reads the argument after an initial byte (an integer or a length).
   * @param {number} info
   */
  argument(info) {
    let argument;
    if (info < 24) {
      argument = info;
    } else if (info === 24) {
      argument = this.byte();
    } else if (info === 25) {
      this.need(2);
      argument = this.view.getUint16(this.pos);
      this.pos += 2;
    } else if (info === 26) {
      this.need(4);
      argument = this.view.getUint32(this.pos);
      this.pos += 4;
    } else if (info === 27) {
      this.need(8);
      const high = this.view.getUint32(this.pos);
      const low = this.view.getUint32(this.pos + 4);
      this.pos += 8;
      if (high > 0x1fffff) {
        throw new CborError("argument_out_of_range", "Decoded CBOR integer or length is outside the safe range");
      }
      argument = high * TWO_32 + low;
    } else if (info === 31) {
      throw new CborError("indefinite_length", "Indefinite-length CBOR items are not supported");
    } else {
      throw new CborError("malformed_additional_info", `Malformed CBOR additional information (${info})`);
    }
    return argument;
  }

  /**
   * Reads the length of a string or container and checks it against `limit`.
   * @param {number} info
   * @param {string} kind
   * @param {number} limit
   */
  length(info, kind, limit) {
    if (info === 31) {
      throw new CborError("indefinite_length", `Indefinite-length CBOR ${kind}s are not supported`);
    }
    const length = this.argument(info);
    if (length > limit) {
      const errorKind = kind === "array" || kind === "map" ? "container_limit" : "byte_length_limit";
      throw new CborError(errorKind, `CBOR ${kind} length exceeds configured limit of ${limit}`);
    }
    return length;
  }

  /**
   * @param {number} depth
   * @returns {unknown}
   */
  item(depth) {
    if (depth > this.maxDepth) throw depthError(this.maxDepth);
    const initial = this.byte();
    const info = initial & 0x1f;
    switch (initial >> 5) {
      case 0:
        return this.argument(info);
      case 1: {
        const argument = this.argument(info);
        if (argument >= MAX_SAFE_INTEGER) {
          throw new CborError("integer_out_of_range", "Decoded CBOR integer is outside the safe range");
        }
        return -1 - argument;
      }
      case 2: {
        const len = this.length(info, "byte string", this.limits.maxByteLen);
        this.need(len);
        const bytes = this.bytes.slice(this.pos, this.pos + len);
        this.pos += len;
        return bytes;
      }
      case 3:
        return this.text(info);
      case 4: {
        const len = this.length(info, "array", this.limits.maxContainerLen);
        // Nothing is reserved from the declared length: a short input ends as truncated.
        const items = [];
        for (let i = 0; i < len; i++) items.push(this.item(depth + 1));
        return items;
      }
      case 5:
        return this.map(info, depth);
      case 6:
        throw new CborError("tag", "CBOR tags are not supported");
      default:
        return this.simple(info);
    }
  }

  /** @param {number} info */
  text(info) {
    const len = this.length(info, "text string", this.limits.maxByteLen);
    this.need(len);
    const bytes = this.bytes.subarray(this.pos, this.pos + len);
    this.pos += len;
    try {
      return utf8Decoder.decode(bytes);
    } catch {
      const at = utf8ValidUpTo(bytes);
      throw new CborError("invalid_utf8", `CBOR text string contains invalid UTF-8 (at byte ${Math.max(at, 0)})`);
    }
  }

  /**
   * @param {number} info
   * @param {number} depth
   */
  map(info, depth) {
    const len = this.length(info, "map", this.limits.maxContainerLen);
    /** @type {Record<string, unknown>} */
    const map = Object.create(null);
    for (let i = 0; i < len; i++) {
      const key = this.key(depth + 1);
      if (Object.prototype.hasOwnProperty.call(map, key)) throw duplicateKeyError(key);
      map[key] = this.item(depth + 1);
    }
    return map;
  }

  /**
   * Reads a map key, which must be a text string.
   * @param {number} depth
   */
  key(depth) {
    if (depth > this.maxDepth) throw depthError(this.maxDepth);
    if (this.pos >= this.bytes.length) throw truncated();
    const initial = this.bytes[this.pos];
    if (initial >> 5 === 3) {
      this.pos++;
      return this.text(initial & 0x1f);
    }
    // Decode it anyway so that a malformed key reports what is wrong with it.
    const key = this.item(depth);
    throw new CborError("non_text_key", `CBOR map keys must be strings, got ${kindOf(key)}`);
  }

  /** @param {number} info */
  simple(info) {
    switch (info) {
      case 20:
        return false;
      case 21:
        return true;
      case 22:
        return null;
      case 27: {
        this.need(8);
        const f = this.view.getFloat64(this.pos);
        this.pos += 8;
        if (!Number.isFinite(f)) {
          throw new CborError("non_finite_number", `Decoded CBOR number must be finite, got ${rustFloat(f)}`);
        }
        if (Number.isInteger(f) && Math.abs(f) > MAX_SAFE_INTEGER) {
          throw new CborError(
            "integer_out_of_range",
            `Decoded CBOR integer is outside the safe range (${rustExp(f)})`,
          );
        }
        return f;
      }
      case 31:
        throw new CborError("break", "CBOR break marker is not supported");
      default: {
        const what = SIMPLE_NAMES[info] ?? "unassigned simple value";
        const hex = (0xe0 | info).toString(16).padStart(2, "0");
        throw new CborError(
          "unsupported_simple",
          `Unsupported CBOR simple value or floating-point width: 0x${hex} (${what})`,
        );
      }
    }
  }
}

/**
 * @param {Uint8Array | ArrayBuffer | ArrayBufferView} bytes
 * @returns {Uint8Array}
 */
function asBytes(bytes) {
  if (bytes instanceof Uint8Array) return bytes;
  if (bytes instanceof ArrayBuffer) return new Uint8Array(bytes);
  if (ArrayBuffer.isView(bytes)) return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  throw new TypeError("expected a Uint8Array, an ArrayBuffer or an ArrayBuffer view");
}

/**
 * Decodes exactly one CBOR item; trailing bytes are an error. Non-minimal
 * integers and lengths are accepted; integral float64 values come back as
 * integers (they are the same JS number).
 *
 * @param {Uint8Array | ArrayBuffer | ArrayBufferView} bytes
 * @param {CborLimits} [limits] default {@link DEFAULT_LIMITS}
 * @returns {unknown}
 * @throws {CborError}
 */
export function decode(bytes, limits) {
  const input = asBytes(bytes);
  const resolved = resolveLimits(limits);
  if (input.length > resolved.maxByteLen) {
    throw new CborError("byte_length_limit", `CBOR byte length exceeds configured limit of ${resolved.maxByteLen}`);
  }
  const decoder = new Decoder(input, resolved);
  const value = decoder.item(0);
  const trailing = input.length - decoder.pos;
  if (trailing !== 0) {
    throw new CborError("trailing_data", `CBOR payload contains trailing data (${trailing} bytes after the item)`);
  }
  return value;
}

// ---------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------

/**
 * Frame options: the frame limit and the payload's CBOR limits.
 * @typedef {CborLimits & { maxFrameLen?: number }} FrameOptions
 */

/**
 * Encodes `value` as one whole frame: its payload length (4 bytes, big
 * endian), then the payload.
 *
 * @param {unknown} value
 * @param {FrameOptions} [options] `maxFrameLen` default {@link DEFAULT_MAX_FRAME_LEN}
 * @returns {Uint8Array}
 * @throws {CborError | FrameError}
 */
export function encodeFrame(value, options) {
  const maxFrameLen = options?.maxFrameLen ?? DEFAULT_MAX_FRAME_LEN;
  const payload = encode(value, options);
  if (payload.length > maxFrameLen) {
    throw new FrameError(
      "too_long",
      `Frame payload length ${payload.length} exceeds configured limit of ${maxFrameLen}`,
    );
  }
  const frame = new Uint8Array(FRAME_HEADER_LEN + payload.length);
  new DataView(frame.buffer).setUint32(0, payload.length);
  frame.set(payload, FRAME_HEADER_LEN);
  return frame;
}

/**
 * Decodes one WebSocket message that must hold exactly one whole frame: the
 * length prefix must be at most `maxFrameLen` and equal to the bytes that
 * follow it.
 *
 * @param {Uint8Array | ArrayBuffer | ArrayBufferView} bytes
 * @param {FrameOptions} [options] `maxFrameLen` default {@link DEFAULT_MAX_FRAME_LEN}
 * @returns {unknown}
 * @throws {FrameError | CborError}
 */
export function decodeFrame(bytes, options) {
  const input = asBytes(bytes);
  const maxFrameLen = options?.maxFrameLen ?? DEFAULT_MAX_FRAME_LEN;
  if (input.length < FRAME_HEADER_LEN) {
    throw new FrameError(
      "truncated",
      `Truncated frame at end of stream (${input.length} of ${FRAME_HEADER_LEN} header bytes)`,
    );
  }
  const len = new DataView(input.buffer, input.byteOffset, input.byteLength).getUint32(0);
  if (len > maxFrameLen) {
    throw new FrameError("too_long", `Frame length ${len} exceeds configured limit of ${maxFrameLen}`);
  }
  const rest = input.length - FRAME_HEADER_LEN;
  if (rest < len) {
    throw new FrameError("truncated", `Truncated frame at end of stream (${rest} of ${len} payload bytes)`);
  }
  if (rest > len) {
    throw new FrameError(
      "trailing_data",
      `A message must hold one whole frame (${rest - len} bytes after a frame of ${len} payload bytes)`,
    );
  }
  return decode(input.subarray(FRAME_HEADER_LEN), options);
}

// The demo's traffic (as examples/demo.d/solid_queue/demo_common.rb draws it): a burst of jobs of one
// greedy tenant, then small tenants arriving as a Poisson process, from a
// fixed seed. The generator is Ruby's (MT19937 seeded as Ruby seeds it,
// rand as genrand_res53, rand(n) by masked rejection), so a seed gives the
// same arrival times and tenants as the Ruby adapters.

// MT19937 with Ruby's seeding (init_genrand for a seed of one 32-bit word,
// init_by_array for a longer one) and its float and integer draws.
export class RubyRandom {
  constructor(seed) {
    this.mt = new Uint32Array(624);
    this.index = 625;
    const words = wordsOf(seed);
    if (words.length <= 1) this.#initGenrand(words[0]);
    else this.#initByArray(words);
  }

  // init_genrand: the base state from one 32-bit word.
  #initGenrand(s) {
    const mt = this.mt;
    mt[0] = s >>> 0;
    for (let i = 1; i < 624; i++) {
      const prev = mt[i - 1] ^ (mt[i - 1] >>> 30);
      mt[i] = (Math.imul(1812433253, prev) + i) >>> 0;
    }
    this.index = 624;
  }

  // init_by_array: Ruby's seeding for seeds wider than 32 bits.
  #initByArray(key) {
    const mt = this.mt;
    this.#initGenrand(19650218);
    let i = 1;
    let j = 0;
    for (let k = Math.max(624, key.length); k > 0; k--) {
      const prev = mt[i - 1] ^ (mt[i - 1] >>> 30);
      mt[i] = ((mt[i] ^ Math.imul(prev, 1664525)) + key[j] + j) >>> 0;
      i++;
      j++;
      if (i >= 624) { mt[0] = mt[623]; i = 1; }
      if (j >= key.length) j = 0;
    }
    for (let k = 623; k > 0; k--) {
      const prev = mt[i - 1] ^ (mt[i - 1] >>> 30);
      mt[i] = ((mt[i] ^ Math.imul(prev, 1566083941)) - i) >>> 0;
      i++;
      if (i >= 624) { mt[0] = mt[623]; i = 1; }
    }
    mt[0] = 0x80000000;
  }

  // genrand_int32: the next 32-bit output.
  int32() {
    const mt = this.mt;
    if (this.index >= 624) {
      for (let k = 0; k < 624; k++) {
        const y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7fffffff);
        mt[k] = mt[(k + 397) % 624] ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0);
      }
      this.index = 0;
    }
    let y = mt[this.index++];
    y ^= y >>> 11;
    y = (y ^ ((y << 7) & 0x9d2c5680)) >>> 0;
    y = (y ^ ((y << 15) & 0xefc60000)) >>> 0;
    return (y ^ (y >>> 18)) >>> 0;
  }

  // Random#rand with no argument: a float in [0, 1) with 53 random bits.
  float() {
    const a = this.int32() >>> 5;
    const b = this.int32() >>> 6;
    return (a * 67108864 + b) / 9007199254740992;
  }

  // Random#rand(n) for 0 < n <= 2^32: an integer in [0, n).
  int(n) {
    const limit = n - 1;
    let mask = limit;
    for (const s of [1, 2, 4, 8, 16]) mask |= mask >>> s;
    mask >>>= 0;
    for (;;) {
      const v = (this.int32() & mask) >>> 0;
      if (v <= limit) return v;
    }
  }
}

// The 32-bit words of a non-negative integer seed, least significant first.
function wordsOf(seed) {
  let n = BigInt(seed);
  const words = [];
  do {
    words.push(Number(n & 0xffffffffn));
    n >>= 32n;
  } while (n > 0n);
  return words;
}

// The small tenants' arrivals: [seconds from the start, tenant number
// 1..smallTenants], a Poisson process of smallRate jobs/s over seconds.
export function arrivals({ seed, seconds, smallRate, smallTenants }) {
  const rng = new RubyRandom(seed);
  const out = [];
  let t = 0;
  if (smallRate <= 0 || smallTenants <= 0) return out;
  for (;;) {
    t += -Math.log(1 - rng.float()) / smallRate;
    if (t >= seconds) return out;
    out.push([t, 1 + rng.int(smallTenants)]);
  }
}

// Parses "--name value" options into an object of camelCase keys.
export function parseOptions(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z-]+)$/.exec(argv[i]);
    if (!m) throw new Error(`unexpected argument: ${argv[i]}`);
    out[m[1].replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = argv[++i];
  }
  return out;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

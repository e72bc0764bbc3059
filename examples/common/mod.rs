//! What the examples share: their argument lists, the GPU they run on and a
//! small deterministic random source.

#![allow(dead_code)] // each example uses part of it

use kbit::Context;

/// The positive integers of the command line; anything else prints `usage`
/// and exits with status 2.
pub fn positive_args(usage: &str) -> Vec<usize> {
    let mut args = Vec::new();
    for a in std::env::args().skip(1) {
        match a.parse::<usize>() {
            Ok(v) if v > 0 => args.push(v),
            _ => {
                eprintln!("usage: {usage} (positive integers), got {a:?}");
                std::process::exit(2);
            }
        }
    }
    args
}

/// A context on device 0, or (no CUDA GPU) a line saying so and exit
/// status 3. Loading the kernels is silent and, the first time on a
/// machine, slow, so it says so first.
pub fn context_or_exit(program: &str) -> kbit::Result<Context> {
    if Context::device_count().is_ok_and(|n| n > 0) {
        eprintln!(
            "{program}: loading the kernels (the first run on a machine can take a minute: the driver compiles the PTX)"
        );
    }
    match Context::new(0) {
        Ok(c) => Ok(c),
        Err(kbit::Error::NoDevice(why)) => {
            eprintln!("{program}: no CUDA GPU ({why})");
            std::process::exit(3);
        }
        Err(e) => Err(e),
    }
}

/// xorshift64: deterministic values, the same on every machine.
pub struct XorShift(pub u64);

impl XorShift {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-0.5, 0.5).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 11) as f32 / (1u64 << 53) as f32 - 0.5
    }
}

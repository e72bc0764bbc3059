//! Quantized weights on the host, in the flat (interchange) and the runtime
//! (tiled) layout.

use crate::{Codebook, Error, Result};
use kbit_format::tile;

/// The shape of a weight `W[N, K]`: N out features (rows), K in features
/// (columns, a multiple of 32).
///
/// ```
/// let s = kbit::Shape::new(4096, 2048)?;
/// assert_eq!(s.num_blocks(), 4096 * 2048 / 32);
/// assert!(kbit::Shape::new(16, 100).is_err());
/// # Ok::<(), kbit::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Out features (rows of W).
    pub n: usize,
    /// In features (columns of W), a multiple of 32.
    pub k: usize,
}

impl Shape {
    /// Validates N ≥ 1, K a positive multiple of 32, and fewer than 2^32 − 1
    /// quant blocks, counting the zero half tile of the runtime layout when
    /// `K % 64 == 32` (the kernels index blocks and their storage slots with
    /// u32).
    ///
    /// ```
    /// let s = kbit::Shape::new(4096, 2048)?;
    /// assert_eq!((s.n, s.k), (4096, 2048));
    /// assert!(matches!(kbit::Shape::new(0, 64), Err(kbit::Error::OutFeatures)));
    /// assert!(matches!(kbit::Shape::new(16, 100), Err(kbit::Error::InFeatures(100))));
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn new(n: usize, k: usize) -> Result<Self> {
        if n == 0 {
            return Err(Error::OutFeatures);
        }
        if k == 0 || k % 32 != 0 {
            return Err(Error::InFeatures(k));
        }
        let blocks = n.checked_mul(k.div_ceil(64) * 2).ok_or(Error::TooLarge { n, k })?;
        if blocks >= u32::MAX as usize || n > u32::MAX as usize || k > u32::MAX as usize {
            return Err(Error::TooLarge { n, k });
        }
        Ok(Self { n, k })
    }

    /// Elements `N·K`.
    ///
    /// ```
    /// assert_eq!(kbit::Shape::new(4096, 2048)?.numel(), 4096 * 2048);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn numel(&self) -> usize {
        self.n * self.k
    }

    /// Quant blocks `N·K/32`.
    ///
    /// ```
    /// assert_eq!(kbit::Shape::new(16, 96)?.num_blocks(), 16 * 3);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn num_blocks(&self) -> usize {
        self.numel() / kbit_format::BLOCK
    }

    /// Plane words of the flat layout, including the k padding words.
    ///
    /// ```
    /// let s = kbit::Shape::new(16, 64)?;
    /// assert_eq!(s.flat_words(4), (32 + 1) * 4); // 32 blocks × 4 planes, then 4 padding words
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn flat_words(&self, bits: u32) -> usize {
        (self.num_blocks() + 1) * bits as usize
    }

    /// Absmax entries of the flat layout, including the padding entry.
    ///
    /// ```
    /// assert_eq!(kbit::Shape::new(16, 64)?.flat_absmax(), 32 + 1);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn flat_absmax(&self) -> usize {
        self.num_blocks() + 1
    }

    /// Plane words of the runtime layout.
    ///
    /// ```
    /// let s = kbit::Shape::new(16, 96)?; // K % 64 == 32: the last K tile has a zero half
    /// assert_eq!(s.tiled_words(4), 2 * 16 * 2 * 4); // 2 K tiles × 16 columns × 2 halves × 4 planes
    /// assert_eq!(s.tiled_words(4) - s.num_blocks() * 4, 16 * 4); // one zero half per column
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn tiled_words(&self, bits: u32) -> usize {
        tile::words(self.n, self.k, bits as usize)
    }

    /// Scale bytes of the runtime layout.
    ///
    /// ```
    /// assert_eq!(kbit::Shape::new(16, 96)?.tiled_scales(), 2 * 16 * 2);
    /// assert_eq!(kbit::Shape::new(16, 128)?.tiled_scales(), 2 * 16 * 2);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn tiled_scales(&self) -> usize {
        tile::scales(self.n, self.k)
    }

    /// Bytes a kernel streams to read the whole weight in the runtime layout.
    ///
    /// ```
    /// let s = kbit::Shape::new(4096, 4096)?;
    /// // k/8 bytes per value plus one scale byte per 32-value block: (4 + 0.25) / 16 of fp16.
    /// assert_eq!(s.tiled_bytes(4), s.numel() / 2 + s.numel() / 32);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn tiled_bytes(&self, bits: u32) -> usize {
        self.tiled_words(bits) * 4 + self.tiled_scales()
    }
}

/// What repack does with a block absmax above 31 (the E4M4 maximum).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScaleMode {
    /// Report [`Error::ScaleRange`] naming the first such block.
    #[default]
    Strict,
    /// Clamp to 31.0 (values past it lose accuracy).
    Saturate,
}

pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got { Ok(()) } else { Err(Error::Length { what, expected, got }) }
}

/// A quantized weight in the flat interchange layout (FORMAT.md): for block
/// `b`, plane `j` is `packed[b·k + j]`, its scale `absmax[b]` (f32); k zero
/// padding words and one zero padding absmax follow.
#[derive(Clone, Debug, PartialEq)]
pub struct FlatWeight {
    shape: Shape,
    codebook: Codebook,
    packed: Vec<u32>,
    absmax: Vec<f32>,
}

impl FlatWeight {
    /// Assembles a flat weight from its parts (e.g. read from a file),
    /// checking the lengths (padding included).
    ///
    /// ```
    /// let (shape, cb) = (kbit::Shape::new(1, 32)?, kbit::Codebook::nf(2)?);
    /// let flat = kbit::FlatWeight::from_parts(shape, cb.clone(), vec![0; 4], vec![0.0; 2])?;
    /// assert_eq!(flat.packed().len(), 4); // 1 block × 2 planes + 2 padding words
    /// assert!(kbit::FlatWeight::from_parts(shape, cb, vec![0; 2], vec![0.0; 2]).is_err());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn from_parts(shape: Shape, codebook: Codebook, packed: Vec<u32>, absmax: Vec<f32>) -> Result<Self> {
        check_len("packed words", shape.flat_words(codebook.bits()), packed.len())?;
        check_len("absmax entries", shape.flat_absmax(), absmax.len())?;
        Ok(Self { shape, codebook, packed, absmax })
    }

    /// The shape.
    ///
    /// ```
    /// let shape = kbit::Shape::new(1, 64)?;
    /// let w: Vec<f32> = (0..64).map(|i| i as f32 - 40.0).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// assert_eq!(flat.shape(), shape);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// The codebook (and so the bit width).
    ///
    /// ```
    /// let shape = kbit::Shape::new(1, 64)?;
    /// let w: Vec<f32> = (0..64).map(|i| i as f32 - 40.0).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// assert_eq!(flat.codebook().bits(), 4);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn codebook(&self) -> &Codebook {
        &self.codebook
    }
    /// Plane words, padding included.
    ///
    /// ```
    /// let shape = kbit::Shape::new(1, 64)?;
    /// let w: Vec<f32> = (0..64).map(|i| i as f32 - 40.0).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// assert_eq!(flat.packed().len(), (2 + 1) * 4);
    /// assert_eq!(&flat.packed()[2 * 4..], &[0; 4]); // padding
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn packed(&self) -> &[u32] {
        &self.packed
    }
    /// Block absmax values, padding included.
    ///
    /// ```
    /// let shape = kbit::Shape::new(1, 64)?;
    /// let w: Vec<f32> = (0..64).map(|i| i as f32 - 40.0).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// assert_eq!(flat.absmax(), &[40.0, 23.0, 0.0]); // two blocks, then padding
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn absmax(&self) -> &[f32] {
        &self.absmax
    }
}

/// A quantized weight in the runtime (tiled) layout with E4M4 scales
/// (`kbit_format::tile`), as it lives on the device.
#[derive(Clone, Debug, PartialEq)]
pub struct TiledWeight {
    shape: Shape,
    codebook: Codebook,
    packed: Vec<u32>,
    scales: Vec<u8>,
}

impl TiledWeight {
    /// Assembles a tiled weight from its parts, checking the lengths.
    ///
    /// ```
    /// let (shape, cb) = (kbit::Shape::new(1, 32)?, kbit::Codebook::nf(2)?);
    /// let tiled = kbit::TiledWeight::from_parts(shape, cb.clone(), vec![0; 4], vec![0; 2])?; // with the zero half
    /// assert_eq!(tiled.scales().len(), 2);
    /// assert!(kbit::TiledWeight::from_parts(shape, cb, vec![0; 2], vec![0; 1]).is_err());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn from_parts(shape: Shape, codebook: Codebook, packed: Vec<u32>, scales: Vec<u8>) -> Result<Self> {
        check_len("tiled words", shape.tiled_words(codebook.bits()), packed.len())?;
        check_len("tiled scales", shape.tiled_scales(), scales.len())?;
        Ok(Self { shape, codebook, packed, scales })
    }

    /// The shape.
    ///
    /// ```
    /// let shape = kbit::Shape::new(1, 32)?;
    /// let w: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let tiled = kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?;
    /// assert_eq!(tiled.shape(), shape);
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// The codebook (and so the bit width).
    ///
    /// ```
    /// let shape = kbit::Shape::new(1, 32)?;
    /// let w: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let tiled = kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?;
    /// assert_eq!(tiled.codebook(), flat.codebook());
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn codebook(&self) -> &Codebook {
        &self.codebook
    }
    /// Plane words in tile order.
    ///
    /// ```
    /// let shape = kbit::Shape::new(1, 32)?;
    /// let w: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let tiled = kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?;
    /// assert_eq!(&tiled.packed()[..4], &flat.packed()[..4]); // the one block's 4 planes
    /// assert_eq!(&tiled.packed()[4..], &[0; 4]); // the zero half tile
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn packed(&self) -> &[u32] {
        &self.packed
    }
    /// E4M4 scale bytes in tile order.
    ///
    /// ```
    /// let shape = kbit::Shape::new(1, 32)?;
    /// let w: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
    /// let flat = kbit::reference::quantize(&w, shape, &kbit::Codebook::nf(4)?)?;
    /// let tiled = kbit::reference::repack(&flat, kbit::ScaleMode::Strict)?;
    /// assert_eq!(tiled.scales(), &[0xC0, 0]); // absmax 2.0 in E4M4, then the zero half
    /// # Ok::<(), kbit::Error>(())
    /// ```
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }
}

//! On-disk format constants and codecs (see FORMAT.md).

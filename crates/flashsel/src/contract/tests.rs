use super::*;
use half::{bf16, f16};

fn keys_sorted<T: ScoreElem>(xs: &[T], nan: NanPolicy) {
    for w in xs.windows(2) {
        assert!(w[0].key(nan) < w[1].key(nan), "{:?} !< {:?} under {nan:?}", w[0], w[1]);
    }
}

#[test]
fn f32_keys_follow_float_order() {
    let xs = [
        f32::NEG_INFINITY,
        -f32::MAX,
        -1.5,
        -f32::MIN_POSITIVE,
        -1e-45, // largest negative denormal
        0.0,
        1e-45,
        f32::MIN_POSITIVE,
        1.0,
        f32::MAX,
        f32::INFINITY,
    ];
    keys_sorted(&xs, NanPolicy::Lowest);
    keys_sorted(&xs, NanPolicy::Largest);
}

#[test]
fn zero_signs_are_equal_and_nans_are_one_key() {
    for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
        assert_eq!((-0.0f32).key(nan), 0.0f32.key(nan));
        assert_eq!(bf16::from_f32(-0.0).key(nan), bf16::ZERO.key(nan));
        assert_eq!(f16::from_f32(-0.0).key(nan), f16::ZERO.key(nan));
        let n1 = f32::from_bits(0x7fc0_0000);
        let n2 = f32::from_bits(0xffc0_0001);
        let n3 = f32::from_bits(0x7f80_0001);
        assert_eq!(n1.key(nan), n2.key(nan));
        assert_eq!(n1.key(nan), n3.key(nan));
    }
    assert!(f32::NAN.key(NanPolicy::Lowest) < f32::NEG_INFINITY.key(NanPolicy::Lowest));
    assert!(f32::NAN.key(NanPolicy::Largest) > f32::INFINITY.key(NanPolicy::Largest));
    assert!(bf16::NAN.key(NanPolicy::Lowest) < bf16::NEG_INFINITY.key(NanPolicy::Lowest));
    assert!(f16::NAN.key(NanPolicy::Largest) > f16::INFINITY.key(NanPolicy::Largest));
}

#[test]
fn half_keys_follow_float_order_exhaustively() {
    // Every non-NaN bit pattern, sorted by value, must give non-decreasing keys,
    // strictly increasing except across -0.0/+0.0.
    for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
        let mut b: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).filter(|x| !x.is_nan()).collect();
        b.sort_by(|x, y| x.partial_cmp(y).unwrap());
        for w in b.windows(2) {
            if w[0] == w[1] {
                assert_eq!(w[0].key(nan), w[1].key(nan));
            } else {
                assert!(w[0].key(nan) < w[1].key(nan));
            }
        }
        let mut h: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).filter(|x| !x.is_nan()).collect();
        h.sort_by(|x, y| x.partial_cmp(y).unwrap());
        for w in h.windows(2) {
            if w[0] == w[1] {
                assert_eq!(w[0].key(nan), w[1].key(nan));
            } else {
                assert!(w[0].key(nan) < w[1].key(nan));
            }
        }
        for x in (0..=u16::MAX).map(bf16::from_bits) {
            assert!(x.key(nan) <= 0xffff);
        }
    }
}

#[test]
fn composite_breaks_ties_by_lower_index() {
    let k = 1.0f32.key(NanPolicy::Lowest);
    assert!(composite(k, 3) > composite(k, 7));
    assert!(composite(k + 1, 1000) > composite(k, 0));
    assert_eq!(composite_index(composite(k, 12345)), 12345);
    assert_eq!(composite_key(composite(k, 12345)), k);
}

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

#[test]
fn reference_pads_and_orders() {
    let data = [0.5f32, 2.0, -1.0, 2.0, f32::NAN, 0.0, -0.0];
    let v = ScoresView::new(&data, 1, 7).unwrap();
    let spec = v.spec(4);
    let s = reference_select(&v, &spec, None).unwrap();
    assert_eq!(s.indices, vec![1, 3, 0, 5]);
    let s = reference_select(&v, &spec.with_order(OutputOrder::Index), None).unwrap();
    assert_eq!(s.indices, vec![0, 1, 3, 5]);
    let s = reference_select(&v, &spec.with_nan(NanPolicy::Largest), None).unwrap();
    assert_eq!(s.indices, vec![4, 1, 3, 0]);
    let s = reference_select(&v, &spec, Some(&[2])).unwrap();
    assert_eq!(s.indices, vec![1, 0, -1, -1]);
    assert!(s.values[2].is_infinite() && s.values[2] < 0.0);
}

#[test]
fn bad_input_is_a_typed_error() {
    let data = [0.0f32; 8];
    let v = ScoresView::new(&data, 2, 4).unwrap();
    assert_eq!(reference_select(&v, &v.spec(0), None), Err(Error::ZeroK));
    assert!(matches!(
        reference_select(&v, &v.spec(2), Some(&[1, 5])),
        Err(Error::LengthOutOfRange { row: 1, len: 5, cols: 4 })
    ));
    assert!(matches!(reference_select(&v, &v.spec(2), Some(&[-1, 0])), Err(Error::LengthOutOfRange { .. })));
    assert!(matches!(reference_select(&v, &v.spec(2), Some(&[1])), Err(Error::LengthsCount { .. })));
    assert!(matches!(ScoresView::with_stride(&data, 2, 4, 3), Err(Error::StrideTooShort { .. })));
    assert!(matches!(ScoresView::new(&data, 3, 4), Err(Error::BufferSize { .. })));
    let mut shrunk = ScoresView::new(&data, 2, 4).unwrap();
    shrunk.rows = 3; // the fields are public: validation re-checks the buffer
    assert!(matches!(
        reference_select(&shrunk, &SelectSpec::new(3, 4, 2, DType::F32), None),
        Err(Error::BufferSize { .. })
    ));
    let big = SelectSpec::new(1 << 20, 8, 1 << 12, DType::F32);
    assert!(matches!(big.validate(), Err(Error::TooLarge { what: "rows * k", .. })));
    assert!(matches!(SelectSpec::new(1, 8, 1 << 31, DType::F32).validate(), Err(Error::TooLarge { what: "k", .. })));
}

use super::*;
use crate::contract::{DType, Error, NanPolicy, ScoresView};

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
    assert!(matches!(reference_select(&v, &SelectSpec::new(3, 4, 2, DType::F32), None), Err(Error::Shape(_))));
    assert!(matches!(SelectSpec::new(1, 4, 2, DType::F8E4M3).validate(), Err(Error::UnknownDType(_))));
    let big = SelectSpec::new(1 << 20, 8, 1 << 12, DType::F32);
    assert!(matches!(big.validate(), Err(Error::TooLarge { what: "rows * k", .. })));
    assert!(matches!(SelectSpec::new(1, 8, 1 << 31, DType::F32).validate(), Err(Error::TooLarge { what: "k", .. })));
}

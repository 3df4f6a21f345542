//! Checks of the dense reference itself (tests/common/reference.rs) on tiny
//! hand-made inputs, for the toolkit methods `mp`, `ls`, `nicdm` and
//! `dissim-local`, and of its erfc / log Φ. Expected values were computed by
//! hand where the numbers allow it, and otherwise with mpmath at 40 digits
//! straight from the METHODS.md formulas (never from the reference's code).
mod common;

use common::reference::{erfc, ln_erfc, log_ndtr, Dense, Method, Scores};
use common::Table;

/// A table of 2-D rows (f32-exact values, so the inputs are exact).
fn table(prefix: &str, rows: &[[f32; 2]]) -> Table {
    Table {
        ids: (0..rows.len()).map(|i| format!("{prefix}{i}")).collect(),
        dim: 2,
        data: rows.iter().flatten().copied().collect(),
        targets: None,
    }
}

fn real(dense: &Dense, method: Method) -> Vec<Vec<f64>> {
    match dense.scores(method) {
        Scores::Real(s) => s,
        Scores::Gc(_) => panic!("{} is not a gc score", method.name()),
    }
}

/// Every score within `rel` (relative, absolute below 1) of `expected`.
fn assert_scores(got: &[Vec<f64>], expected: &[&[f64]], rel: f64, context: &str) {
    assert_eq!(got.len(), expected.len(), "{context}: queries");
    for (q, (g_row, e_row)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g_row.len(), e_row.len(), "{context}: gallery items");
        for (g, (&a, &b)) in g_row.iter().zip(e_row.iter()).enumerate() {
            assert!(
                (a - b).abs() <= rel * b.abs().max(1.0),
                "{context}: q{q} g{g}: {a} vs expected {b}"
            );
        }
    }
}

fn relative_error(got: f64, want: f64) -> f64 {
    ((got - want) / want).abs()
}

// ------------------------------------------------------------------ erfc, log Φ

/// erfc at points of all three of Cody's intervals and both signs, against
/// mpmath (50 digits, rounded to f64).
#[test]
fn erfc_matches_mpmath() {
    let cases = [
        (-3.0, 1.9999779095030015),
        (-1.0, 1.8427007929497148),
        (-0.4, 1.4283923550466684),
        (-0.1, 1.1124629160182848),
        (0.0, 1.0),
        (1e-8, 0.9999999887162083),
        (0.2, 0.7772974107895215),
        (0.46875, 0.507386526782062),
        (0.5, 0.4795001221869535),
        (0.9, 0.20309178757716786),
        (1.5, 0.033894853524689274),
        (2.5, 0.0004069520174449589),
        (3.9, 3.4792248597231765e-08),
        (4.0, 1.541725790028002e-08),
        (4.1, 6.700027654084918e-09),
        (6.0, 2.1519736712498913e-17),
        (10.0, 2.088487583762545e-45),
        (20.0, 5.395865611607901e-176),
        (26.0, 5.663192408856143e-296),
    ];
    for (x, want) in cases {
        let got = erfc(x);
        assert!(
            relative_error(got, want) <= 1e-13,
            "erfc({x}) = {got:e}, mpmath {want:e}"
        );
        // ln erfc near erfc = 1 (x near 0) carries erfc's relative error as
        // an absolute one: relative to max(1, |ln erfc|).
        let (got_ln, want_ln) = (ln_erfc(x), want.ln());
        assert!(
            (got_ln - want_ln).abs() <= 1e-13 * want_ln.abs().max(1.0),
            "ln erfc({x}) = {got_ln}, mpmath {want_ln}"
        );
    }
}

/// ln erfc past the underflow of erfc (x > 26.5), against mpmath.
#[test]
fn ln_erfc_is_finite_past_the_underflow() {
    let cases = [
        (27.0, -732.8688865078974),
        (28.284271247461902, -803.9152948331939),
        (30.0, -903.9741171106439),
        (100.0, -10005.177585122665),
        (1e4, -100000009.78270532),
    ];
    for (x, want) in cases {
        let got = ln_erfc(x);
        assert!(
            relative_error(got, want) <= 1e-13,
            "ln erfc({x}) = {got}, mpmath {want}"
        );
    }
}

/// log Φ against mpmath, far into the lower tail and on the upper side.
/// Φ(−1) = 0.15865525393145705… (scipy's ndtr prints …707, one ulp above
/// the correctly rounded …705).
#[test]
fn log_ndtr_matches_mpmath() {
    assert!(relative_error(log_ndtr(-1.0).exp(), 0.15865525393145705) <= 1e-13);
    let cases = [
        (-1.0, -1.8410216450092636),
        (-10.0, -53.23128515051247),
        (-40.0, -804.6084420137538),
        (-38.5, -745.695270290411),
        (-27.0, -368.71614246865636),
        (-20.0, -203.91715537109727),
        (-5.0, -15.064998393988725),
        (-3.0, -6.607726221510349),
        (-0.3, -0.9621028181688507),
        (0.0, -std::f64::consts::LN_2),
        (0.001, -0.6923496142726883),
        (0.5, -0.3689464152886564),
        (3.0, -0.0013508099647481938),
        (8.0, -6.220960574271786e-16),
    ];
    for (x, want) in cases {
        let got = log_ndtr(x);
        assert!(got.is_finite(), "log Φ({x}) = {got}");
        assert!(
            relative_error(got, want) <= 1e-13,
            "log Φ({x}) = {got}, mpmath {want}"
        );
    }
}

// ------------------------------------------------------------------ ls, nicdm, dissim-local

/// Raw dot products (normalize = false), 2-D, k = 1 and 2:
/// gallery g0 = (1, 0), g1 = (0, 3); bank b0 = (3, 0), b1 = (1, 1),
/// b2 = (−2, 1), b3 = (0, −1); queries q0 = (1, 1), q1 = (2, −1).
/// s(b, g0) = 3, 1, −2, 0 → N_2(g0) = [b0, b1]; s(b, g1) = 0, 3, 3, −3 → b1
/// and b2 tie, so N_1(g1) = [b1] (the smaller bank row; `raw_case_swapped`
/// checks that it is the row order that decides), N_2(g1) = [b1, b2].
/// Distances: d(b0, g0) = 2, d(b1, g0) = 1, d(b1, g1) = √5, d(b2, g1) = √8;
/// d²(q0, g0) = 1, d²(q0, g1) = 5, d²(q1, g0) = 2, d²(q1, g1) = 20.
fn raw_case() -> Dense {
    let gallery = table("g", &[[1.0, 0.0], [0.0, 3.0]]);
    let bank = table("b", &[[3.0, 0.0], [1.0, 1.0], [-2.0, 1.0], [0.0, -1.0]]);
    let queries = table("q", &[[1.0, 1.0], [2.0, -1.0]]);
    Dense::new(&queries, &gallery, &bank, None, false)
}

/// `raw_case` with bank rows 1 and 2 swapped: (−2, 1) now comes first, and
/// N_1(g1) must follow the row order, not the vector.
fn raw_case_swapped() -> Dense {
    let gallery = table("g", &[[1.0, 0.0], [0.0, 3.0]]);
    let bank = table("b", &[[3.0, 0.0], [-2.0, 1.0], [1.0, 1.0], [0.0, -1.0]]);
    let queries = table("q", &[[1.0, 1.0], [2.0, -1.0]]);
    Dense::new(&queries, &gallery, &bank, None, false)
}

/// ls: σ_1 = (d(b0, g0), d(b1, g1)) = (2, √5); σ_2 = (d(b1, g0), d(b2, g1)) = (1, √8).
#[test]
fn ls_on_hand_made_vectors() {
    let d = raw_case();
    let sqrt5 = 5f64.sqrt();
    let sqrt8 = 8f64.sqrt();
    assert_scores(
        &real(&d, Method::Ls { k: 1 }),
        &[&[-1.0 / 2.0, -5.0 / sqrt5], &[-2.0 / 2.0, -20.0 / sqrt5]],
        1e-14,
        "ls k = 1",
    );
    assert_scores(
        &real(&d, Method::Ls { k: 2 }),
        &[&[-1.0, -5.0 / sqrt8], &[-2.0, -20.0 / sqrt8]], // σ_2 = (1, √8)
        1e-14,
        "ls k = 2",
    );
    // The tie s(b1, g1) = s(b2, g1) goes to the smaller bank row: with the
    // rows swapped, σ_1(g1) = d((−2, 1), g1) = √8.
    assert_scores(
        &real(&raw_case_swapped(), Method::Ls { k: 1 }),
        &[&[-1.0 / 2.0, -5.0 / sqrt8], &[-2.0 / 2.0, -20.0 / sqrt8]],
        1e-14,
        "ls k = 1, bank rows 1 and 2 swapped",
    );
    assert_eq!(Method::Ls { k: 5 }.name(), "ls");
}

/// nicdm: r_1 = (2, √5); r_2 = ((2 + 1)/2, (√5 + √8)/2); score −d / sqrt(r).
#[test]
fn nicdm_on_hand_made_vectors() {
    let d = raw_case();
    let (sqrt2, sqrt5, sqrt8) = (2f64.sqrt(), 5f64.sqrt(), 8f64.sqrt());
    // k = 1 from mpmath: [−0.7071067811865476, −1.4953487812212205],
    // [−1.0, −2.990697562442441] (= −1/√2, −5^(1/4), −√2/√2, −√20/5^(1/4)).
    assert_scores(
        &real(&d, Method::Nicdm { k: 1 }),
        &[
            &[-std::f64::consts::FRAC_1_SQRT_2, -1.4953487812212205],
            &[-1.0, -2.990697562442441],
        ],
        1e-14,
        "nicdm k = 1",
    );
    let r1 = (sqrt5 + sqrt8) / 2.0;
    assert_scores(
        &real(&d, Method::Nicdm { k: 2 }),
        &[
            &[-1.0 / 1.5f64.sqrt(), -sqrt5 / r1.sqrt()],
            &[-sqrt2 / 1.5f64.sqrt(), -20f64.sqrt() / r1.sqrt()],
        ],
        1e-14,
        "nicdm k = 2",
    );
    // The same from mpmath.
    assert_scores(
        &real(&d, Method::Nicdm { k: 2 }),
        &[
            &[-0.816496580927726, -1.4051798784573222],
            &[-1.1547005383792515, -2.8103597569146443],
        ],
        1e-14,
        "nicdm k = 2 (mpmath)",
    );
    assert_eq!(Method::Nicdm { k: 5 }.name(), "nicdm");
}

/// dissim-local: c_1 = (b0, b1) = ((3, 0), (1, 1)) → h = ((1 − 4)/2, (9 − 5)/2)
/// = (−1.5, 2); c_2 = ((2, 0.5), (−0.5, 1)) → h = ((1 − 1.25)/2, (9 − 4.25)/2)
/// = (−0.125, 2.375). s(q0, ·) = (1, 3), s(q1, ·) = (2, −3).
#[test]
fn dissim_local_on_hand_made_vectors() {
    let d = raw_case();
    assert_eq!(d.dissim_local_corrections(1), vec![-1.5, 2.0]);
    assert_eq!(d.dissim_local_corrections(2), vec![-0.125, 2.375]);
    assert_scores(
        &real(&d, Method::DissimLocal { k: 1 }),
        &[&[2.5, 1.0], &[3.5, -5.0]],
        1e-15,
        "dissim-local k = 1",
    );
    assert_scores(
        &real(&d, Method::DissimLocal { k: 2 }),
        &[&[1.125, 0.625], &[2.125, -5.375]],
        1e-15,
        "dissim-local k = 2",
    );
    // Tie to the smaller bank row: with rows 1 and 2 swapped, c_1(g1) = (−2, 1)
    // and h(g1) = (9 − |(2, 2)|²)/2 = 0.5.
    assert_eq!(
        raw_case_swapped().dissim_local_corrections(1),
        vec![-1.5, 0.5]
    );
    assert_eq!(Method::DissimLocal { k: 5 }.name(), "dissim-local");
}

/// With normalize = true the rows are unit vectors and d = sqrt(2 − 2s).
/// Inputs not of unit length: gallery (3, 4), (0, 2), (−5, 0); bank (2, 0),
/// (0, −3), (1, 1), (4, 3), (−1, 2); queries (1, 2), (−3, −1); k = 2
/// (N_2 = [b2, b3], [b4, b2], [b4, b1]). Expected values: mpmath on the
/// normalised vectors.
#[test]
fn toolkit_methods_on_normalised_rows() {
    let gallery = table("g", &[[3.0, 4.0], [0.0, 2.0], [-5.0, 0.0]]);
    let bank = table(
        "b",
        &[[2.0, 0.0], [0.0, -3.0], [1.0, 1.0], [4.0, 3.0], [-1.0, 2.0]],
    );
    let queries = table("q", &[[1.0, 2.0], [-3.0, -1.0]]);
    let d = Dense::new(&queries, &gallery, &bank, None, true);
    assert_eq!(d.bank_neighbours(0, 2), vec![2, 3]);
    assert_eq!(d.bank_neighbours(1, 2), vec![4, 2]);
    assert_eq!(d.bank_neighbours(2, 2), vec![4, 1]);
    assert_scores(
        &real(&d, Method::Ls { k: 2 }),
        &[
            &[
                -0.11405695949504072,
                -0.27587504467495466,
                -2.046669094406771,
            ],
            &[
                -12.884844553364928,
                -3.439468904839139,
                -0.07257277587322124,
            ],
        ],
        1e-12,
        "ls, normalised",
    );
    assert_scores(
        &real(&d, Method::Nicdm { k: 2 }),
        &[
            &[-0.3898053376996744, -0.587165534750454, -1.5322454040611868],
            &[-4.14311013735987, -2.0732422044338876, -0.28853026794287545],
        ],
        1e-12,
        "nicdm, normalised",
    );
    assert_scores(
        &real(&d, Method::DissimLocal { k: 2 }),
        &[
            &[0.5063825366846159, 0.42271714641089364, -0.6444271909999159],
            &[-1.2996795650590702, -0.7879378106058601, 0.7514697025505559],
        ],
        1e-12,
        "dissim-local, normalised",
    );
}

// ------------------------------------------------------------------ mp

/// Raw dot products: gallery (1, 0), (0, 1), (1, 1); bank (1, 0), (0, 1),
/// (1, 1), (−1, 0), so s(b, ·) = (1, 0, 1, −1), (0, 1, 1, 0), (1, 1, 2, −1):
/// μ_B = (0.25, 0.5, 0.75), σ_B² = (0.6875, 0.25, 1.1875); queries (2, 0),
/// (0, −1), (−30, 0), the last one 36 σ_B below μ_B(g0) (log Φ ≈ −670, the
/// far tail). μ(q), σ(q) over the gallery, or over the gallery bank (0, 2),
/// (1, −1), (3, 1). Expected values: mpmath (40 digits) of the formula.
fn mp_case(with_gallery_bank: bool) -> Dense {
    let gallery = table("g", &[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]);
    let bank = table("b", &[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]);
    let queries = table("q", &[[2.0, 0.0], [0.0, -1.0], [-30.0, 0.0]]);
    let gallery_bank = table("h", &[[0.0, 2.0], [1.0, -1.0], [3.0, 1.0]]);
    Dense::new(
        &queries,
        &gallery,
        &bank,
        with_gallery_bank.then_some(&gallery_bank),
        false,
    )
}

#[test]
fn mp_over_the_gallery() {
    // q0, g0: z_B = (2 − 0.25)/√0.6875 = 2.11058, z_q = (2 − 4/3)/√(8/9) = 0.707107.
    assert_scores(
        &real(&mp_case(false), Method::Mp),
        &[
            &[
                -0.2916655065191304,
                -4.383774335502457,
                -0.40841064204014643,
            ],
            &[-1.0455270497811522, -8.03588453190738, -4.3442141966045],
            &[-671.444689661618, -1.9229365078911382, -403.8198926041889],
        ],
        1e-12,
        "mp without a gallery bank",
    );
    assert_eq!(Method::Mp.name(), "mp");
}

#[test]
fn mp_over_the_gallery_bank() {
    // q0: s(q0, ĝ) = (0, 2, 6): μ = 8/3, σ = √(56/9); z_q(g0) = (2 − 8/3)/σ = −0.267261.
    assert_scores(
        &real(&mp_case(true), Method::Mp),
        &[
            &[
                -0.9473539665249094,
                -3.7892615800002707,
                -1.0640991020459254,
            ],
            &[-1.3152854444500566, -7.537522714300514, -3.8458523789976344],
            &[-670.5184534179938, -1.9947845543474074, -402.8936563605647],
        ],
        1e-12,
        "mp with a gallery bank",
    );
}

/// The normalised 2-D case of `toolkit_methods_on_normalised_rows` with a
/// gallery bank (1, 3), (−2, 1), (2, −1), (0, 1) (normalised too); mpmath.
#[test]
fn mp_on_normalised_rows() {
    let gallery = table("g", &[[3.0, 4.0], [0.0, 2.0], [-5.0, 0.0]]);
    let bank = table(
        "b",
        &[[2.0, 0.0], [0.0, -3.0], [1.0, 1.0], [4.0, 3.0], [-1.0, 2.0]],
    );
    let queries = table("q", &[[1.0, 2.0], [-3.0, -1.0]]);
    let gallery_bank = table("h", &[[1.0, 3.0], [-2.0, 1.0], [2.0, -1.0], [0.0, 1.0]]);
    let d = Dense::new(&queries, &gallery, &bank, Some(&gallery_bank), true);
    assert_scores(
        &real(&d, Method::Mp),
        &[
            &[-0.375628695507451, -0.39226891051423707, -4.39836931865207],
            &[-5.555227967111998, -2.388442985268005, -0.02411066940423602],
        ],
        1e-12,
        "mp, normalised, with a gallery bank",
    );
}

/// A constant bank column (σ_B = 0) is refused, naming the item.
#[test]
#[should_panic(expected = "σ_B of gallery row 1")]
fn mp_refuses_a_zero_sigma() {
    let gallery = table("g", &[[1.0, 0.0], [0.0, 1.0]]);
    let bank = table("b", &[[1.0, 0.0], [-1.0, 0.0]]); // s(b, g1) = 0, 0
    let queries = table("q", &[[1.0, 1.0]]);
    Dense::new(&queries, &gallery, &bank, None, false).scores(Method::Mp);
}

"""A generated WebShop-style catalog and its shopping instructions, deterministic by seed.

The real WebShop scrapes 1.18 M Amazon products; nothing of it can be shipped (docs/platform.md).
This module writes a few hundred products of the same *shape* instead: an ASIN, a title, a price,
a ``›``-separated ``product_category`` (top level first), the scraping ``query``, attributes,
buying options (``{"color": [...], "size": [...]}``), a description, bullet points and reviews.
Five top-level categories mirror WebShop's five (beauty, fashion, electronics, grocery, home), four
product types each. The top-level slug is the env's ``task_type``.

Instructions (``Goal``) follow WebShop's synthetic goals: a target product, one to three of its
attributes, one value for each of its options (names sorted, WebShop's ``" with k: v, and k: v"``)
and ``price_upper`` = the larger of two distinct draws from the first four values of
``[10, 20, ..., 990]`` above the target's price, appended as ``", and price lower than X.00
dollars"`` (no price clause when fewer than two such values exist).

Example (``generate_goal(build_catalog(0, 400), "train", 1858)``, a real one, task 1858 of the
env's train split)::

    Goal(asin='B0EQCFRM6X', attributes=('crew neck', 'short sleeve', 'cotton'),
         options={'color': 'royal blue', 'size': 'large'}, price_upper=50.0, category='fashion',
         instruction="i want to buy a men's t-shirt which is crew neck, short sleeve and cotton with
                      color: royal blue, and size: large, and price lower than 50.00 dollars", ...)
    # the target: 'Lakeview Apparel Short Sleeve Crew Neck Men's T-Shirt', $15.99,
    # 'Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts'

Construction rules that keep the reward formula meaningful on generated text (checked in tests):

* An option value never occurs (after colour normalisation) in its product's title, bullets or
  description: WebShop's option reward also credits an option found as a substring of the product
  text, which would credit wrong choices here. Offending values are dropped at generation time
  (an option left with fewer than two values is dropped entirely).
* Within an option other than ``size`` (exact match) and colours (normalised on purpose), no two
  values fuzzy-match (``token_set_ratio > 85``); size-like options are therefore named ``size``.
* Target products are split by product type into disjoint train / valid / test pools (80% / 10%
  / 10% of each type, at least one each), so evaluation targets are never training targets.
  WebShop splits goal indices instead (test 0-499, eval 500-1499, train the rest).
* The reward does not look at the ASIN: any product of the asked-for type with the asked-for
  attributes, options and price wins. So a goal's *requirement* (``requirement``: product type,
  attribute set, option values) belongs to one split too (``requirement_split``, 80/10/10 by a
  stable hash), and the env redraws a goal until its requirement is of the task's split
  (``env.draw_goal``): a valid or test instruction never asks what a train instruction asks (with
  only the price limit or the sentence changed). A held-out goal can still be won by buying a
  train target that happens to have what it asks (about 73% of valid goals with the default
  catalog), as any shopper in WebShop may buy another product than the one the goal was written
  from. tests/unit/test_split_webshop.py checks the splits as sets.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field

SPLITS = ("train", "valid", "test")

# Top-level category slug (the env's task type) -> the category's display name (first level).
CATEGORIES = {
    "beauty": "Beauty & Personal Care",
    "fashion": "Clothing, Shoes & Jewelry",
    "electronics": "Electronics",
    "grocery": "Grocery & Gourmet Food",
    "home": "Home & Kitchen",
}
TASK_TYPES = tuple(CATEGORIES)

# Our fixed colour set, alphabetical; ``normalize_color`` returns the first member found as a
# substring, as WebShop's normaliser does with its own (longer) list, so "navy blue" -> "blue".
COLOR_SET = (
    "beige",
    "black",
    "blue",
    "brown",
    "burgundy",
    "charcoal",
    "coral",
    "gold",
    "gray",
    "green",
    "grey",
    "ivory",
    "khaki",
    "maroon",
    "navy",
    "olive",
    "orange",
    "pink",
    "purple",
    "red",
    "silver",
    "teal",
    "turquoise",
    "white",
    "yellow",
)

PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))  # WebShop's PRICE_RANGE: 10, 20, ..., 990


def normalize_color(value: str) -> str:
    """The first colour of ``COLOR_SET`` contained in ``value``, else ``value`` unchanged."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


@dataclass(frozen=True, slots=True)
class ProductType:
    """One kind of product: the template a catalog draws its products from."""

    key: str
    category: str  # top-level slug, a key of CATEGORIES
    path: tuple[str, ...]  # category levels below the top level
    noun: str  # what instructions call it ("shampoo", "women's running shoes")
    title_noun: str  # how titles spell it ("Shampoo", "Women's Running Shoes")
    plural: bool
    query: str  # WebShop's per-product scraping query; equal queries count as a type match
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (name, all values) in display order
    price: tuple[int, int]  # whole-dollar range
    blurb: str  # one sentence of description, no option words


def _t(key, category, path, noun, title_noun, query, attributes, options, price, blurb, plural=False):
    return ProductType(
        key,
        category,
        tuple(path.split(" › ")),
        noun,
        title_noun,
        plural,
        query,
        tuple(attributes),
        tuple((k, tuple(v)) for k, v in options.items()),
        price,
        blurb,
    )


APPAREL_COLORS = (
    "black",
    "white",
    "navy blue",
    "heather grey",
    "olive green",
    "burgundy",
    "charcoal",
    "royal blue",
    "khaki",
    "pink",
)
CLOTHING_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large")

PRODUCT_TYPES: tuple[ProductType, ...] = (
    # ----- beauty -----------------------------------------------------------------------------
    _t(
        "shampoo",
        "beauty",
        "Hair Care › Shampoo & Conditioner › Shampoos",
        "shampoo",
        "Shampoo",
        "shampoo",
        [
            "sulfate free",
            "paraben free",
            "argan oil",
            "for dry hair",
            "color safe",
            "tea tree",
            "cruelty free",
            "natural ingredients",
        ],
        {
            "scent": ["coconut", "eucalyptus", "citrus", "vanilla", "unscented", "sandalwood"],
            "size": ["8.5 fl oz", "12 fl oz", "16.9 fl oz", "33.8 fl oz"],
        },
        (7, 34),
        "A gentle daily wash that cleans the scalp and leaves hair soft and easy to comb.",
    ),
    _t(
        "moisturizer",
        "beauty",
        "Skin Care › Face › Creams & Moisturizers",
        "face moisturizer",
        "Face Moisturizer",
        "face moisturizer",
        [
            "hyaluronic acid",
            "oil free",
            "for sensitive skin",
            "fragrance free",
            "spf 30",
            "non comedogenic",
            "vitamin c",
            "dermatologist tested",
        ],
        {"size": ["1 fl oz", "1.7 fl oz", "2.5 fl oz", "3.4 fl oz"]},
        (9, 58),
        "A light lotion that absorbs quickly and keeps skin hydrated all day.",
    ),
    _t(
        "lipstick",
        "beauty",
        "Makeup › Lips › Lipstick",
        "lipstick",
        "Lipstick",
        "lipstick",
        [
            "long lasting",
            "matte finish",
            "moisturizing",
            "cruelty free",
            "vegan",
            "waterproof",
            "shea butter",
            "smudge proof",
        ],
        {
            "color": ["red", "pink", "coral", "burgundy", "maroon", "brown", "purple", "orange"],
            "size": ["single", "pack of 2", "pack of 3"],
        },
        (5, 29),
        "A smooth bullet that glides on evenly and stays put through meals.",
    ),
    _t(
        "toothbrush",
        "beauty",
        "Oral Care › Toothbrushes & Accessories › Powered Toothbrushes",
        "electric toothbrush",
        "Electric Toothbrush",
        "electric toothbrush",
        [
            "rechargeable",
            "two minute timer",
            "pressure sensor",
            "travel case",
            "soft bristles",
            "whitening mode",
            "waterproof",
            "long battery life",
        ],
        {"color": ["black", "white", "pink", "blue", "green"]},
        (19, 89),
        "A sonic brush head that sweeps away plaque with gentle pulses.",
    ),
    # ----- fashion ----------------------------------------------------------------------------
    _t(
        "tshirt",
        "fashion",
        "Men › Clothing › Shirts › T-Shirts",
        "men's t-shirt",
        "Men's T-Shirt",
        "men's t-shirts",
        [
            "cotton",
            "short sleeve",
            "crew neck",
            "machine wash",
            "relaxed fit",
            "moisture wicking",
            "pre shrunk",
            "tagless",
        ],
        {"color": list(APPAREL_COLORS), "size": list(CLOTHING_SIZES)},
        (8, 32),
        "An everyday tee with a soft hand feel that keeps its shape wash after wash.",
    ),
    _t(
        "running_shoes",
        "fashion",
        "Women › Shoes › Athletic › Running",
        "women's running shoes",
        "Women's Running Shoes",
        "women's running shoes",
        [
            "breathable mesh",
            "lightweight",
            "non slip",
            "memory foam",
            "arch support",
            "rubber sole",
            "knit upper",
            "cushioned",
        ],
        {
            "color": ["black", "white", "pink", "grey", "purple", "teal", "coral"],
            "size": ["6", "6.5", "7", "7.5", "8", "8.5", "9", "10"],
        },
        (29, 119),
        "A springy trainer for road runs, gym sessions and long walks.",
        plural=True,
    ),
    _t(
        "dress",
        "fashion",
        "Women › Clothing › Dresses › Casual",
        "summer dress",
        "Summer Dress",
        "women's summer dress",
        [
            "floral print",
            "v neck",
            "short sleeve",
            "knee length",
            "with pockets",
            "loose fit",
            "polyester",
            "machine wash",
        ],
        {"color": ["black", "navy blue", "pink", "green", "yellow", "white", "coral"], "size": list(CLOTHING_SIZES)},
        (17, 49),
        "A flowy dress for warm days, easy to dress up or down.",
    ),
    _t(
        "necklace",
        "fashion",
        "Women › Jewelry › Necklaces › Pendants",
        "pendant necklace",
        "Pendant Necklace",
        "women's pendant necklace",
        [
            "sterling silver",
            "hypoallergenic",
            "gift box",
            "adjustable chain",
            "nickel free",
            "heart pendant",
            "cubic zirconia",
            "tarnish resistant",
        ],
        {"size": ["16 inch", "18 inch", "20 inch", "22 inch"]},
        (15, 79),
        "A delicate pendant that makes a thoughtful gift for birthdays and anniversaries.",
    ),
    # ----- electronics ------------------------------------------------------------------------
    _t(
        "earbuds",
        "electronics",
        "Headphones, Earbuds & Accessories › Headphones & Earbuds › Earbud Headphones",
        "wireless earbuds",
        "Wireless Earbuds",
        "wireless earbuds",
        [
            "noise cancelling",
            "bluetooth 5.3",
            "charging case",
            "water resistant",
            "built-in microphone",
            "touch control",
            "long battery life",
            "fast charging",
        ],
        {"color": ["black", "white", "pink", "green", "purple"]},
        (19, 129),
        "Compact buds with rich sound for calls, music and workouts.",
        plural=True,
    ),
    _t(
        "power_bank",
        "electronics",
        "Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
        "portable charger",
        "Portable Charger Power Bank",
        "portable charger",
        [
            "fast charging",
            "usb c",
            "slim design",
            "led display",
            "wireless charging",
            "airline safe",
            "dual output",
            "compact",
        ],
        {"size": ["5000mah", "10000mah", "20000mah", "26800mah"], "color": ["black", "white", "pink"]},
        (15, 69),
        "Keeps phones and tablets topped up on trips and commutes.",
    ),
    _t(
        "hdmi_cable",
        "electronics",
        "Television & Video › Accessories › Cables › HDMI Cables",
        "hdmi cable",
        "HDMI Cable",
        "hdmi cable",
        [
            "4k 60hz",
            "high speed",
            "braided nylon",
            "gold plated connectors",
            "ethernet channel",
            "for gaming consoles",
            "flexible",
            "hdr support",
        ],
        {"size": ["3 feet", "6 feet", "10 feet", "15 feet", "25 feet"]},
        (6, 29),
        "Connects streaming boxes, consoles and laptops to a television or monitor.",
    ),
    _t(
        "mouse",
        "electronics",
        "Computers & Accessories › Keyboards, Mice & Accessories › Mice",
        "wireless mouse",
        "Wireless Mouse",
        "wireless mouse",
        [
            "ergonomic",
            "silent click",
            "rechargeable",
            "adjustable dpi",
            "usb receiver",
            "bluetooth",
            "for laptop",
            "long battery life",
        ],
        {"color": ["black", "white", "grey", "pink", "red"]},
        (9, 49),
        "A comfortable pointer for office work, study and travel.",
    ),
    # ----- grocery ----------------------------------------------------------------------------
    _t(
        "coffee",
        "grocery",
        "Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
        "ground coffee",
        "Ground Coffee",
        "ground coffee",
        [
            "100% arabica",
            "fair trade",
            "usda organic",
            "low acid",
            "kosher",
            "rainforest alliance",
            "smooth finish",
            "freshly roasted",
        ],
        {
            "flavor": ["hazelnut", "french vanilla", "mocha", "caramel", "original", "cinnamon"],
            "size": ["12 ounce", "24 ounce", "32 ounce"],
        },
        (8, 39),
        "A balanced cup for drip machines and pour over brewers.",
    ),
    _t(
        "protein_bars",
        "grocery",
        "Snack Foods › Bars › Protein Bars",
        "protein bars",
        "Protein Bars",
        "protein bars",
        [
            "gluten free",
            "high protein",
            "low sugar",
            "non gmo",
            "plant based",
            "keto friendly",
            "no artificial sweeteners",
            "dairy free",
        ],
        {
            "flavor": ["peanut butter", "chocolate chip", "almond", "cookie dough", "coconut"],
            "size": ["12 count", "15 count", "24 count"],
        },
        (14, 45),
        "A chewy snack for busy mornings, hikes and post workout recovery.",
        plural=True,
    ),
    _t(
        "herbal_tea",
        "grocery",
        "Beverages › Coffee, Tea & Cocoa › Tea › Herbal",
        "herbal tea",
        "Herbal Tea",
        "herbal tea",
        [
            "caffeine free",
            "organic",
            "non gmo",
            "individually wrapped",
            "kosher",
            "gluten free",
            "compostable bags",
            "sugar free",
        ],
        {
            "flavor": ["chamomile", "peppermint", "ginger", "hibiscus", "rooibos"],
            "size": ["20 count", "40 count", "100 count"],
        },
        (5, 24),
        "A soothing cup for quiet evenings.",
    ),
    _t(
        "mixed_nuts",
        "grocery",
        "Snack Foods › Nuts & Seeds › Mixed Nuts",
        "mixed nuts",
        "Mixed Nuts",
        "mixed nuts",
        ["unsalted", "dry roasted", "resealable bag", "non gmo", "kosher", "high protein", "vegan", "no added oil"],
        {"flavor": ["honey", "sea salt", "smoked", "original"], "size": ["1 pound", "2 pound", "3 pound"]},
        (9, 38),
        "Cashews, almonds and pecans for snacking at home or on the go.",
        plural=True,
    ),
    # ----- home -------------------------------------------------------------------------------
    _t(
        "pillow_covers",
        "home",
        "Home Décor Products › Decorative Pillows, Inserts & Covers › Throw Pillow Covers",
        "throw pillow covers",
        "Throw Pillow Covers",
        "throw pillow covers",
        ["velvet", "hidden zipper", "machine washable", "set of 2", "for couch", "square", "linen", "farmhouse style"],
        {
            "color": ["navy blue", "grey", "beige", "green", "pink", "mustard yellow", "ivory"],
            "size": ["16 x 16 inch", "18 x 18 inch", "20 x 20 inch", "24 x 24 inch"],
        },
        (9, 35),
        "Soft covers that refresh a sofa, bed or reading nook.",
        plural=True,
    ),
    _t(
        "towels",
        "home",
        "Bath › Towels › Bath Towels",
        "bath towel set",
        "Bath Towel Set",
        "bath towel set",
        [
            "100% cotton",
            "quick dry",
            "highly absorbent",
            "machine washable",
            "oeko-tex certified",
            "plush",
            "lightweight",
            "hotel quality",
        ],
        {
            "color": ["white", "grey", "navy blue", "beige", "teal", "charcoal"],
            "size": ["2 piece", "4 piece", "6 piece", "8 piece"],
        },
        (19, 69),
        "Thick towels that feel cozy after every bath.",
    ),
    _t(
        "frying_pan",
        "home",
        "Kitchen & Dining › Cookware › Pots & Pans › Skillets",
        "frying pan",
        "Frying Pan",
        "nonstick frying pan",
        [
            "nonstick",
            "induction compatible",
            "dishwasher safe",
            "oven safe",
            "pfoa free",
            "stay cool handle",
            "stainless steel",
            "granite coating",
        ],
        {"size": ["8 inch", "10 inch", "12 inch"], "color": ["black", "grey", "blue"]},
        (15, 79),
        "An everyday skillet for eggs, stir fries and pancakes.",
    ),
    _t(
        "desk_lamp",
        "home",
        "Lighting & Ceiling Fans › Lamps & Shades › Desk Lamps",
        "led desk lamp",
        "LED Desk Lamp",
        "led desk lamp",
        [
            "dimmable",
            "usb charging port",
            "eye caring",
            "touch control",
            "adjustable arm",
            "energy efficient",
            "memory function",
            "auto off timer",
        ],
        {"color": ["black", "white", "silver", "grey"]},
        (14, 59),
        "A bright task light for reading, homework and crafts.",
    ),
)

BRANDS = {
    "beauty": ("Verdalis", "Lumora", "Oakleaf Botanics", "Puriva", "Maison Clair", "Seabright"),
    "fashion": ("Northway", "Kestrel & Co", "Amberly", "Fieldstone", "Lakeview Apparel", "Rivetta"),
    "electronics": ("Voltora", "Sonique", "Nexbridge", "Quillon", "Arctek", "Brightpath"),
    "grocery": ("Harvest Lane", "Golden Hollow Farms", "Mountain Pantry", "Bramble & Bee", "Sunfold", "Kettlewood"),
    "home": ("Hearthly", "Linden House", "Cozymere", "Stonebrook", "Alder Home", "Mapleview"),
}

_ACRONYMS = {"usb", "led", "spf", "hdmi", "gmo", "pfoa", "dpi", "hdr", "usda", "4k", "60hz"}
_BUTTONS = {"back to search", "next >", "< prev", "description", "features", "reviews", "buy now", "search"}

_REVIEWS = (
    ("Exactly as described", "The {attr} part is what sold me and it delivers. Would buy again."),
    ("Good value", "Solid {noun} for the price. {Attr} as promised."),
    ("Happy with it", "Arrived quickly and well packed. I use it every day."),
    ("Does the job", "Not fancy, but it works. The {attr} detail is a nice touch."),
    ("Pleasant surprise", "I was skeptical, but this {noun} turned out great."),
)


@dataclass(frozen=True, slots=True)
class Review:
    title: str
    score: int  # 1-5 stars
    body: str


@dataclass(frozen=True, slots=True)
class Product:
    """One product, in WebShop's field vocabulary (lower-case fields for readability)."""

    asin: str  # upper case, as WebShop shows it; clickables are lower case
    title: str
    price: float
    category: str  # top-level slug (task type)
    product_category: str  # "Beauty & Personal Care › Hair Care › ..."
    query: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]] = field(hash=False)  # name -> values, display order
    description: str = ""
    bullets: tuple[str, ...] = ()
    reviews: tuple[Review, ...] = ()
    rating: float = 0.0
    type_key: str = ""

    def search_text(self) -> str:
        """What the search index sees: title + description + first bullet + options, lower-cased."""
        opts = " ".join(f"{name}: {', '.join(values)}" for name, values in self.options.items())
        first = self.bullets[0] if self.bullets else ""
        return " ".join([self.title, self.description, first, opts]).lower()

    def reward_text(self) -> str:
        """Title, bullets and description, lower-cased: where the reward looks for attributes."""
        return " ".join([self.title, " ".join(self.bullets), self.description]).lower()


@dataclass(frozen=True, slots=True)
class Goal:
    """One shopping instruction (WebShop's goal dict)."""

    asin: str  # the target product
    instruction: str
    attributes: tuple[str, ...]
    options: dict[str, str] = field(hash=False)  # option name -> wanted value
    price_upper: float = 1_000_000.0
    query: str = ""  # the target's query
    product_category: str = ""
    name: str = ""  # the target's title (WebShop's goal["name"] of synthetic goals)
    category: str = ""  # top-level slug


@dataclass(frozen=True, slots=True)
class Catalog:
    seed: int
    products: tuple[Product, ...]
    by_asin: dict[str, Product] = field(hash=False)
    targets: dict[str, tuple[str, ...]] = field(hash=False)  # split -> target ASINs

    @property
    def key(self) -> str:
        return f"s{self.seed}-n{len(self.products)}"


def title_case(phrase: str) -> str:
    return " ".join(w.upper() if w in _ACRONYMS else w[:1].upper() + w[1:] for w in phrase.split())


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _asin(rng: random.Random, taken: set[str]) -> str:
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
    while True:
        asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _make_product(rng: random.Random, ptype: ProductType, taken: set[str]) -> Product:
    brand = rng.choice(BRANDS[ptype.category])
    attrs = tuple(rng.sample(ptype.attributes, rng.randint(3, 4)))
    in_title = list(attrs[: rng.randint(1, 2)])
    title = f"{brand} {' '.join(title_case(a) for a in in_title)} {ptype.title_noun}"
    bullets = (
        f"{title_case(attrs[0])}: {ptype.blurb}",
        *(f"{title_case(a)} for everyday comfort and peace of mind." for a in attrs[1:]),
        f"Backed by {brand} customer care.",
    )
    description = (
        f"The {brand} {ptype.noun} brings together {_join(list(attrs))}. {ptype.blurb} "
        f"Thoughtfully made by {brand} for people who want dependable quality."
    )
    text = " ".join([title, " ".join(bullets), description]).lower()

    options: dict[str, tuple[str, ...]] = {}
    for name, values in ptype.options:
        n = rng.randint(2, min(len(values), 5))
        picked = sorted(rng.sample(range(len(values)), n))
        kept = tuple(values[i] for i in picked if normalize_color(values[i]) not in text)
        if len(kept) >= 2:
            options[name] = kept

    dollars = rng.randint(*ptype.price)
    price = round(dollars + rng.choice((0.99, 0.49, 0.95, 0.0)), 2)
    reviews = []
    for head, body in rng.sample(_REVIEWS, 2):
        attr = rng.choice(attrs)
        reviews.append(Review(head, rng.randint(3, 5), body.format(attr=attr, Attr=attr.capitalize(), noun=ptype.noun)))
    rating = round(sum(r.score for r in reviews) / len(reviews), 1)
    return Product(
        asin=_asin(rng, taken),
        title=title,
        price=price,
        category=ptype.category,
        product_category=" › ".join((CATEGORIES[ptype.category], *ptype.path)),
        query=ptype.query,
        attributes=attrs,
        options=options,
        description=description,
        bullets=bullets,
        reviews=tuple(reviews),
        rating=rating,
        type_key=ptype.key,
    )


@functools.lru_cache(maxsize=8)
def build_catalog(seed: int = 0, n_products: int = 400) -> Catalog:
    """``n_products`` products spread evenly over the product types; cached per (seed, size)."""
    if n_products < 3 * len(PRODUCT_TYPES):
        raise ValueError(
            f"webshop needs n_products >= {3 * len(PRODUCT_TYPES)} (three per product type), got {n_products}"
        )
    rng = random.Random(f"webshop-catalog:{seed}")
    taken: set[str] = set()
    products = tuple(_make_product(rng, PRODUCT_TYPES[i % len(PRODUCT_TYPES)], taken) for i in range(n_products))
    for p in products:  # invariants the reward relies on; a failure is a bug in the tables above
        values = [v for vs in p.options.values() for v in vs]
        assert len(values) == len(set(values)) and not set(values) & _BUTTONS, p
    # Split targets per product type: 10% test, 10% valid (at least one each), the rest train.
    split_rng = random.Random(f"webshop-split:{seed}")
    targets: dict[str, list[str]] = {s: [] for s in SPLITS}
    for ptype in PRODUCT_TYPES:
        asins = [p.asin for p in products if p.type_key == ptype.key]
        split_rng.shuffle(asins)
        k = max(1, len(asins) // 10)
        targets["test"] += asins[:k]
        targets["valid"] += asins[k : 2 * k]
        targets["train"] += asins[2 * k :]
    return Catalog(
        seed=seed,
        products=products,
        by_asin={p.asin: p for p in products},
        targets={s: tuple(v) for s, v in targets.items()},
    )


def price_upper_for(price: float, rng: random.Random) -> float | None:
    """WebShop's rule: the larger of two draws from the first four steps above ``price`` (None: no limit)."""
    steps = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps) < 2:
        return None
    return max(rng.sample(steps, 2))


_TEMPLATES = (
    "i need {art}{noun} that {be} {attrs}",
    "i am looking for {art}{noun} with {attrs}",
    "i want to buy {art}{noun} which {be} {attrs}",
    "find me {art}{noun}, {attrs}",
)


def _instruction(
    rng: random.Random, ptype: ProductType, attrs: tuple[str, ...], options: dict[str, str], price_upper: float | None
) -> str:
    template = rng.choice(_TEMPLATES)
    art = "" if ptype.plural else ("an " if ptype.noun[0] in "aeiou" else "a ")
    base = template.format(art=art, noun=ptype.noun, be="are" if ptype.plural else "is", attrs=_join(list(attrs)))
    option_text = ", and ".join(f"{k}: {v}" for k, v in options.items())
    price_text = f", and price lower than {price_upper:.2f} dollars" if price_upper is not None else ""
    return base + (f" with {option_text}" if option_text else "") + price_text


def generate_goal(catalog: Catalog, split: str, index: int, attempt: int = 0) -> Goal:
    """The goal of task ``index`` of ``split`` (``attempt`` > 0 draws a replacement)."""
    if split not in SPLITS:
        raise ValueError(f"unknown webshop split {split!r}; choose one of {list(SPLITS)}")
    rng = random.Random(f"webshop-goal:{catalog.seed}:{len(catalog.products)}:{split}:{index}:{attempt}")
    pool = catalog.targets[split]
    product = catalog.by_asin[pool[rng.randrange(len(pool))]]
    ptype = next(t for t in PRODUCT_TYPES if t.key == product.type_key)
    k = min(rng.choice((1, 2, 2, 3)), len(product.attributes))
    attrs = tuple(rng.sample(product.attributes, k))
    options = {name: rng.choice(values) for name, values in sorted(product.options.items())}
    upper = price_upper_for(product.price, rng)
    return Goal(
        asin=product.asin,
        instruction=_instruction(rng, ptype, attrs, options, upper),
        attributes=attrs,
        options=options,
        price_upper=1_000_000.0 if upper is None else upper,
        query=product.query,
        product_category=product.product_category,
        name=product.title,
        category=product.category,
    )


def requirement(goal: Goal) -> str:
    """What a goal asks for, which decides the products that earn its full reward (price aside):
    the product type (its query), the set of attributes and the option values. Two goals with the
    same requirement differ only in the sentence template and the price limit."""
    attrs = ", ".join(sorted(goal.attributes))
    opts = ", ".join(f"{k}: {v}" for k, v in sorted(goal.options.items()))
    return f"{goal.query} | {attrs} | {opts}"


def requirement_split(goal: Goal) -> str:
    """The one split a requirement belongs to (80/10/10 train/valid/test by a stable hash of it);
    a task keeps only draws whose requirement is of its split (``env.draw_goal``)."""
    bucket = int(hashlib.sha256(requirement(goal).encode()).hexdigest(), 16) % 10
    return "test" if bucket == 0 else "valid" if bucket == 1 else "train"
